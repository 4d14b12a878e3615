"""GSM8K: greedy generation, exact match of the final number.

Protocol:

* items: the ``test`` split; with ``limit`` below its size, a fixed sample: Fisher–Yates over the
  indices driven by SplitMix64(``0x65736D386B``), the first ``limit`` kept and sorted back into
  file order (the same problems for every arm; a smaller sample is a subset of a larger one);
* prompt, mode ``"fewshot"`` (default, base or instruct models): the first ``shots`` (default 8)
  items of the ``train`` split as ``"Question: {q}\\nAnswer: {a}\\n\\n"`` (the reference solutions
  end with ``"#### N"``), then ``"Question: {q}\\nAnswer:"``; generation stops at a new
  ``"Question:"`` or a blank-line pair, at EOS, or at ``max_new_tokens``;
* prompt, mode ``"chat"`` (instruct models): the tokenizer's chat template with one user turn,
  ``"{q}\\nPlease reason step by step, and put your final answer within \\\\boxed{}."``, generation
  prompt added; generation stops at EOS or the cap;
* greedy decoding;
* extraction: the last number inside the last closed ``\\boxed{…}``; else the number after the last
  ``####``; else the last number of the completion. Gold: the number after the last ``####`` of the
  reference solution;
* both reduced to one decimal spelling (no grouping commas, no leading zeros, no trailing
  fractional zeros, no ``-0``) and compared as strings: no float, no tolerance.

Data: a local directory with ``test.jsonl`` (and ``train.jsonl`` for shots), rows
``{"question", "answer"}`` as in ``openai/gsm8k`` (``.json`` lists and ``*.parquet`` through
``datasets`` also work), or the hub through ``datasets`` when ``path`` is None.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leechq.data.corpus import encode
from leechq.errors import ArtifactError, InvalidInput
from leechq.eval.tasks.base import TASKS, PromptHasher, TaskResult, eos_ids, greedy_generate
from leechq.utils.progress import stage_bar
from leechq.utils.splitmix import SplitMix64

SAMPLE_SEED = 0x0065_736D_386B
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
_NUMBER = re.compile(r"-?\d(?:,(?=\d)|\d)*(?:\.\d+)?")


@dataclass(frozen=True)
class GSM8KItem:
    """One problem: the question and the reference solution (ending in ``#### N``)."""

    question: str
    answer: str


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import datasets
        except ImportError as exc:
            raise ImportError("GSM8K parquet files need the optional 'datasets' package") from exc
        return [
            dict(r) for r in datasets.load_dataset("parquet", data_files=str(path), split="train")
        ]
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    rows = json.loads(text)
    if not isinstance(rows, list):
        raise ArtifactError(f"{path}: expected a JSON list of records")
    return rows


def load_gsm8k(path: str | Path | None = None) -> dict[str, list[GSM8KItem]]:
    """``{"train": [...], "test": [...]}`` from a local directory or the hub (``train`` may be
    empty).

    Raises:
        ArtifactError: no test file, or a record without ``question``/``answer``.
    """
    if path is None:
        try:
            import datasets
        except ImportError as exc:
            raise ImportError(
                "GSM8K from the hub needs the optional 'datasets' package; pass a local directory"
            ) from exc
        return {
            split: [
                GSM8KItem(r["question"], r["answer"])
                for r in datasets.load_dataset("openai/gsm8k", "main", split=split)
            ]
            for split in ("train", "test")
        }
    root = Path(path)
    out: dict[str, list[GSM8KItem]] = {"train": [], "test": []}
    for split in ("train", "test"):
        candidates = [
            root / f"{split}.jsonl",
            root / f"{split}.json",
            *sorted(root.rglob(f"{split}-*.parquet")),
        ]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            if split == "test":
                raise ArtifactError(
                    f"{root}: no GSM8K test data (test.jsonl, test.json, test-*.parquet)"
                )
            continue
        for i, row in enumerate(_read_rows(found)):
            if "question" not in row or "answer" not in row:
                raise ArtifactError(f"{found}:{i + 1}: record needs 'question' and 'answer'")
            out[split].append(GSM8KItem(str(row["question"]), str(row["answer"])))
    return out


def canonical_number(raw: str) -> str | None:
    """One decimal spelling of a number, or None if ``raw`` is not one.

    ``"1,000.50"`` → ``"1000.5"``, ``"-0.0"`` → ``"0"``, ``"007"`` → ``"7"``.
    """
    t = raw.strip().replace(",", "")
    neg = t.startswith("-")
    body = t[1:] if neg else t
    whole, _, frac = body.partition(".")
    if (
        (not whole and not frac)
        or not (whole.isdigit() or whole == "")
        or not (frac.isdigit() or frac == "")
    ):
        return None
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    zero = whole == "0" and not frac
    return ("-" if neg and not zero else "") + whole + ("." + frac if frac else "")


def numbers(text: str) -> list[str]:
    """Numbers as written (optional minus, commas between digits, optional decimals), in order."""
    return _NUMBER.findall(text)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (balanced braces); None if absent or never closed."""
    key = "\\boxed{"
    start = text.rfind(key)
    if start < 0:
        return None
    depth = 1
    for i in range(start + len(key), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(key) : i]
    return None


def gold_answer(solution: str) -> str:
    """Canonical number after the last ``####`` of a reference solution.

    Raises:
        InvalidInput: no ``####`` followed by a number.
    """
    _, sep, tail = solution.rpartition("####")
    nums = numbers(tail) if sep else []
    value = canonical_number(nums[0]) if nums else None
    if value is None:
        raise InvalidInput(f"reference solution has no '#### <number>': {solution[-80:]!r}")
    return value


def extract_answer(completion: str) -> tuple[str | None, str]:
    """``(canonical number or None, source)``.

    ``source`` is ``"boxed"``, ``"####"``, ``"last"`` or ``"none"``.
    """
    boxed = last_boxed(completion)
    if boxed is not None:
        nums = numbers(boxed)
        if nums:
            return canonical_number(nums[-1]), "boxed"
    if "####" in completion:
        nums = numbers(completion.rpartition("####")[2])
        if nums:
            return canonical_number(nums[0]), "####"
    nums = numbers(completion)
    if nums:
        return canonical_number(nums[-1]), "last"
    return None, "none"


def sample_indices(n: int, limit: int | None) -> list[int]:
    """All indices, or the seeded Fisher–Yates sample of ``limit`` of them in ascending order."""
    if limit is None or limit >= n:
        return list(range(n))
    idx = list(range(n))
    rng = SplitMix64(SAMPLE_SEED)
    for i in range(n - 1, 0, -1):
        j = rng.next_u64() % (i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    return sorted(idx[:limit])


def _cut_fewshot(text: str) -> str:
    """A few-shot completion up to where the model starts a new question."""
    for marker in ("\nQuestion:", "Question:", "\n\n\n"):
        pos = text.find(marker)
        if pos >= 0:
            text = text[:pos]
    return text


class GSM8KTask:
    """GSM8K exact-match task (see module docstring)."""

    name = "gsm8k"

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        mode: str = "fewshot",
        shots: int = 8,
        max_new_tokens: int = 256,
        data: dict[str, list[GSM8KItem]] | None = None,
    ) -> None:
        """Args:
        path: data directory (None: the hub through ``datasets``).
        mode: ``"fewshot"`` or ``"chat"``.
        shots: train examples in few-shot prompts.
        max_new_tokens: generation cap.
        data: already loaded ``{"train", "test"}`` items (overrides ``path``).
        """
        if mode not in ("fewshot", "chat"):
            raise InvalidInput(f"GSM8K mode {mode!r}; choices: fewshot, chat")
        self.path = path
        self.mode = mode
        self.shots = shots
        self.max_new_tokens = max_new_tokens
        self._data = data

    def prompt(self, item: GSM8KItem, train: list[GSM8KItem], tokenizer: Any) -> str:
        """The prompt text for one problem."""
        if self.mode == "chat":
            messages = [{"role": "user", "content": f"{item.question.strip()}\n{INSTRUCTION}"}]
            return str(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            )
        shots = "".join(
            f"Question: {s.question.strip()}\nAnswer: {s.answer.strip()}\n\n"
            for s in train[: self.shots]
        )
        return f"{shots}Question: {item.question.strip()}\nAnswer:"

    def run(self, model: Any, tokenizer: Any, *, limit: int | None = None,
            progress: str | None = None) -> TaskResult:
        """Score ``model``; ``limit`` caps the number of problems (fixed seeded sample);
        ``progress`` names a bar on stderr over the problems (None: no bar)."""
        data = self._data if self._data is not None else load_gsm8k(self.path)
        test = data["test"]
        indices = sample_indices(len(test), limit)
        hasher = PromptHasher()
        stops = eos_ids(tokenizer)
        rows = []
        right = 0

        def stop_check(generated: list[int]) -> bool:
            tail = tokenizer.decode(generated[-16:])
            return "Question:" in tail or "\n\n\n" in tail

        with stage_bar(progress or "", len(indices), "problem", progress is not None) as bar:
            for index in indices:
                item = test[index]
                ids = encode(tokenizer, self.prompt(item, data["train"], tokenizer))
                hasher.add(ids)
                gen, reason = greedy_generate(
                    model,
                    ids,
                    max_new_tokens=self.max_new_tokens,
                    stop_ids=stops,
                    stop_check=stop_check if self.mode == "fewshot" else None,
                )
                completion = tokenizer.decode(gen)
                if self.mode == "fewshot":
                    completion = _cut_fewshot(completion)
                gold = gold_answer(item.answer)
                extracted, source = extract_answer(completion)
                correct = extracted == gold
                right += int(correct)
                rows.append(
                    {
                        "index": index,
                        "gold": gold,
                        "extracted": extracted,
                        "source": source,
                        "correct": correct,
                        "stop": reason,
                        "n_gen": len(gen),
                    }
                )
                bar.update(1)
        n = len(indices)
        return TaskResult(
            task=self.name,
            metric="exact_match",
            value=right / n if n else 0.0,
            n=n,
            prompts_fingerprint=hasher.hexdigest(),
            details={
                "mode": self.mode,
                "shots": self.shots if self.mode == "fewshot" else 0,
                "max_new_tokens": self.max_new_tokens,
                "right": right,
                "items": rows,
            },
        )


TASKS.register("gsm8k", lambda: GSM8KTask)
