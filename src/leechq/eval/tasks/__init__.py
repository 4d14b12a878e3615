"""Evaluation tasks over local data files: MMLU (5-shot, letter logits) and GSM8K (exact match).

Importing this package registers the tasks in :data:`TASKS` (name → task class): ``"mmlu"``
(:mod:`leechq.eval.tasks.mmlu`) and ``"gsm8k"`` (:mod:`leechq.eval.tasks.gsm8k`).
"""

from __future__ import annotations

from leechq.eval.tasks.base import TASKS, Task, TaskResult
from leechq.eval.tasks.gsm8k import GSM8KTask
from leechq.eval.tasks.mmlu import MMLUTask

__all__ = ["TASKS", "GSM8KTask", "MMLUTask", "Task", "TaskResult"]
