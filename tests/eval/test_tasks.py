"""MMLU and GSM8K task loaders and scoring on tiny local fixture files, with mock models."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from leechq.errors import ArtifactError, InvalidInput
from leechq.eval.tasks import TASKS, GSM8KTask, MMLUTask, mmlu
from leechq.eval.tasks import gsm8k as g8
from leechq.utils.splitmix import SplitMix64

VOCAB = 4096


class FixedLetter(torch.nn.Module):
    """Always puts the highest logit on one token id (and notes the prompts it saw)."""

    def __init__(self, token: int) -> None:
        super().__init__()
        self.token = token
        self.calls: list[list[int]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls.append(ids[0].tolist())
        out = torch.zeros(ids.shape[0], ids.shape[1], VOCAB)
        out[..., self.token] = 5.0
        return out


ANSWERS = {"abstract_algebra": "BBACD" + "BACBB", "professional_law": "ABBBBBBBBBBBBBBBBBBBB"}


def write_mmlu_csv(root: Path) -> Path:
    for subject, answers in ANSWERS.items():
        for split, rows in (("dev", "ABCDA"), ("test", answers)):
            (root / split).mkdir(parents=True, exist_ok=True)
            with (root / split / f"{subject}_{split}.csv").open("w", newline="") as fh:
                w = csv.writer(fh)
                for i, a in enumerate(rows):
                    w.writerow(
                        [f"{subject} {split} question {i}?", "one", "two", "three", "four", a]
                    )
    return root


def write_mmlu_jsonl(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split in ("dev", "test"):
        with (root / f"{split}.jsonl").open("w") as fh:
            for subject, answers in ANSWERS.items():
                rows = "ABCDA" if split == "dev" else answers
                for i, a in enumerate(rows):
                    fh.write(
                        json.dumps(
                            {
                                "question": f"{subject} {split} question {i}?",
                                "subject": subject,
                                "choices": ["one", "two", "three", "four"],
                                "answer": "ABCD".index(a),
                            }
                        )
                        + "\n"
                    )
    return root


def test_mmlu_loaders_agree(tmp_path: Path) -> None:
    a = mmlu.load_mmlu(write_mmlu_csv(tmp_path / "csv"))
    b = mmlu.load_mmlu(write_mmlu_jsonl(tmp_path / "jsonl"))
    assert a == b
    assert len(a["test"]) == 31 and len(a["dev"]) == 10
    assert a["test"][0] == mmlu.MMLUItem(
        "abstract_algebra", "abstract_algebra test question 0?", ("one", "two", "three", "four"), 1
    )
    with pytest.raises(ArtifactError, match="no MMLU dev data"):
        mmlu.load_mmlu(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dev.jsonl").write_text(
        json.dumps({"question": "q", "subject": "s", "choices": ["a", "b"], "answer": 0})
    )
    with pytest.raises(ArtifactError, match=r"dev\.jsonl:1: expected 4 choices"):
        mmlu.load_mmlu(bad)


def test_mmlu_prompt_format() -> None:
    shot = mmlu.MMLUItem("high_school_physics", " What is 1+1? ", ("1", "2", "3", "4"), 1)
    item = mmlu.MMLUItem("high_school_physics", "What is 2+2?", ("4 ", "5", "6", "7"), 0)
    assert mmlu.build_prompt("high_school_physics", [shot], item) == (
        "The following are multiple choice questions (with answers) about high school physics.\n\n"
        "What is 1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n"
        "What is 2+2?\nA. 4\nB. 5\nC. 6\nD. 7\nAnswer:"
    )


def test_mmlu_scoring_micro_macro(tmp_path: Path, toy_tokenizer) -> None:
    data = mmlu.load_mmlu(write_mmlu_csv(tmp_path))
    b_id = toy_tokenizer.encode(" B")[0]
    model = FixedLetter(b_id)
    res = MMLUTask(data=data, per_subject=None).run(model, toy_tokenizer)
    # always "B": algebra 5/10, law 20/21
    assert res.n == 31
    assert res.details["subjects"]["abstract_algebra"] == {
        "right": 5,
        "scored": 10,
        "population": 10,
    }
    assert res.details["subjects"]["professional_law"] == {
        "right": 20,
        "scored": 21,
        "population": 21,
    }
    assert res.value == pytest.approx(25 / 31) and res.details["accuracy_pooled"] == pytest.approx(
        25 / 31
    )
    assert res.details["accuracy_macro"] == pytest.approx((0.5 + 20 / 21) / 2)
    assert res.details["micro_stderr"] == 0.0  # census
    assert res.details["picked_letters"] == {"A": 0, "B": 31, "C": 0, "D": 0}
    assert sum(res.details["right_letters"].values()) == 31
    assert res.details["right_letters"]["B"] == 25
    # every prompt had 5 shots and ended at "Answer:"
    first = toy_tokenizer.decode(model.calls[0])
    assert first.count("Answer:") == 6 and first.endswith("Answer:") and "abstract algebra" in first
    again = MMLUTask(data=data, per_subject=None).run(FixedLetter(b_id), toy_tokenizer)
    assert again.prompts_fingerprint == res.prompts_fingerprint
    other = MMLUTask(data=data, per_subject=None, shots=2).run(FixedLetter(b_id), toy_tokenizer)
    assert other.prompts_fingerprint != res.prompts_fingerprint and other.value == res.value


def test_mmlu_progress_bar_counts_the_questions(
    tmp_path: Path, toy_tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    data = mmlu.load_mmlu(write_mmlu_csv(tmp_path))
    model = FixedLetter(toy_tokenizer.encode(" B")[0])
    quiet = MMLUTask(data=data, per_subject=None).run(model, toy_tokenizer)
    assert capsys.readouterr().err == ""
    shown = MMLUTask(data=data, per_subject=None).run(model, toy_tokenizer, progress="mmlu (x)")
    err = capsys.readouterr().err
    assert "mmlu (x)" in err and "31/31" in err and "question" in err
    assert shown.to_dict() == quiet.to_dict()  # the bar changes nothing scored


def test_mmlu_sampling_is_seeded_fisher_yates(tmp_path: Path, toy_tokenizer) -> None:
    data = mmlu.load_mmlu(write_mmlu_csv(tmp_path))
    law = [it for it in data["test"] if it.subject == "professional_law"]
    picked = mmlu.sample_items("professional_law", law, 4)
    idx = list(range(21))
    rng = SplitMix64(0x611B0 ^ len("professional_law"))
    for i in range(20, 0, -1):
        j = rng.next_u64() % (i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    assert picked == [law[i] for i in idx[:4]]
    assert mmlu.sample_items("professional_law", law, 50) == law
    res = MMLUTask(data=data).run(
        FixedLetter(toy_tokenizer.encode(" B")[0]), toy_tokenizer, limit=4
    )
    subj = res.details["subjects"]
    assert subj["professional_law"]["scored"] == 4 and subj["professional_law"]["population"] == 21
    rates = {k: v["right"] / v["scored"] for k, v in subj.items()}
    assert res.value == pytest.approx(
        (10 * rates["abstract_algebra"] + 21 * rates["professional_law"]) / 31
    )
    assert res.details["micro_stderr"] > 0 or min(rates.values()) in (0.0, 1.0)


def test_mmlu_stats_unbalanced_example() -> None:
    s = [mmlu.SubjectScore("a", 5, 20, 100), mmlu.SubjectScore("b", 16, 20, 1500)]
    assert mmlu.macro_accuracy(s) == pytest.approx(0.525)
    assert mmlu.micro_accuracy(s) == pytest.approx((100 * 0.25 + 1500 * 0.8) / 1600)


def test_mmlu_letters_must_be_single_tokens() -> None:
    class Chars:
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    with pytest.raises(InvalidInput, match="not a single token"):
        mmlu.letter_token_ids(Chars())


# ---------------------------------------------------------------- GSM8K


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("so the answer is \\boxed{1,234}. Then 7", ("1234", "boxed")),
        ("\\boxed{\\frac{1}{2}} and \\boxed{x = 42.50}", ("42.5", "boxed")),
        ("#### 18\nlater 99", ("18", "####")),
        ("She has 3 apples and 5 pears, total 8.", ("8", "last")),
        ("-0.0 is the answer", ("0", "last")),
        ("no numbers here", (None, "none")),
        ("\\boxed{12", ("12", "last")),  # unclosed box: not an answer box
    ],
)
def test_gsm8k_extraction(completion: str, expected: tuple) -> None:
    assert g8.extract_answer(completion) == expected


def test_gsm8k_canonical_and_gold() -> None:
    assert g8.canonical_number("1,000.50") == "1000.5"
    assert g8.canonical_number("007") == "7" and g8.canonical_number("-3") == "-3"
    assert g8.canonical_number("abc") is None
    assert g8.numbers("3, 4 and 1,000") == ["3", "4", "1,000"]
    assert g8.gold_answer("He pays 5*2=<<5*2=10>>10.\n#### 10") == "10"
    with pytest.raises(InvalidInput, match="####"):
        g8.gold_answer("no final answer")


def test_gsm8k_sample_indices() -> None:
    assert g8.sample_indices(5, None) == [0, 1, 2, 3, 4]
    small, large = g8.sample_indices(100, 10), g8.sample_indices(100, 30)
    assert small == sorted(small) and len(set(small)) == 10
    assert g8.sample_indices(100, 10) == small
    assert len(set(large)) == 30


class Scripted(torch.nn.Module):
    """Answers every prompt with a fixed token script placed after the last "Answer:" token."""

    def __init__(self, answer_token: int, script: list[int]) -> None:
        super().__init__()
        self.answer_token = answer_token
        self.script = script

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids[0].tolist()
        last = len(seq) - 1 - seq[::-1].index(self.answer_token)
        k = len(seq) - 1 - last
        nxt = self.script[k] if k < len(self.script) else 0
        out = torch.zeros(1, ids.shape[1], VOCAB)
        out[0, -1, nxt] = 1.0
        return out


def write_gsm8k(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    train = [{"question": f"Train q {i}?", "answer": f"Work {i}.\n#### {i}"} for i in range(3)]
    test = [
        {"question": f"Test q {i}?", "answer": f"Because.\n#### {v}"}
        for i, v in enumerate([42, 7, 42, 1000])
    ]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    return root


def test_gsm8k_fewshot_exact_match(tmp_path: Path, toy_tokenizer) -> None:
    data = g8.load_gsm8k(write_gsm8k(tmp_path))
    assert len(data["train"]) == 3 and len(data["test"]) == 4
    task = GSM8KTask(data=data, shots=2, max_new_tokens=20)
    prompt = task.prompt(data["test"][0], data["train"], toy_tokenizer)
    assert prompt == (
        "Question: Train q 0?\nAnswer: Work 0.\n#### 0\n\n"
        "Question: Train q 1?\nAnswer: Work 1.\n#### 1\n\nQuestion: Test q 0?\nAnswer:"
    )
    answer_tok = toy_tokenizer.encode("?\nAnswer:")[1]  # the prompt's last token
    script = toy_tokenizer.encode(" 6 times 7 is 42.\n\nQuestion: next")
    model = Scripted(answer_tok, script)
    res = task.run(model, toy_tokenizer)
    assert res.value == pytest.approx(0.5) and res.n == 4
    items = res.details["items"]
    assert [r["correct"] for r in items] == [True, False, True, False]
    assert (
        items[0]["stop"] == "stop"
        and items[0]["extracted"] == "42"
        and items[0]["source"] == "last"
    )
    limited = task.run(model, toy_tokenizer, limit=2)
    assert limited.n == 2 and [r["index"] for r in limited.details["items"]] == g8.sample_indices(
        4, 2
    )


def test_gsm8k_progress_bar_counts_the_problems(
    tmp_path: Path, toy_tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    data = g8.load_gsm8k(write_gsm8k(tmp_path))
    task = GSM8KTask(data=data, shots=2, max_new_tokens=4)
    model = Scripted(toy_tokenizer.encode("?\nAnswer:")[1], toy_tokenizer.encode(" 42."))
    quiet = task.run(model, toy_tokenizer, limit=3)
    assert capsys.readouterr().err == ""
    shown = task.run(model, toy_tokenizer, limit=3, progress="gsm8k (x)")
    err = capsys.readouterr().err
    assert "gsm8k (x)" in err and "3/3" in err and "problem" in err
    assert shown.to_dict() == quiet.to_dict()


def test_gsm8k_chat_mode_and_errors(tmp_path: Path, toy_tokenizer) -> None:
    class ChatTok(type(toy_tokenizer)):
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return f"<user> {messages[0]['content']} <assistant> Answer:"

    tok = ChatTok()
    data = g8.load_gsm8k(write_gsm8k(tmp_path))
    task = GSM8KTask(data=data, mode="chat", max_new_tokens=8)
    assert "\\boxed{}" in task.prompt(data["test"][0], [], tok)
    script = tok.encode(" \\boxed{1,000} done")
    model = Scripted(tok.encode(" Answer:")[0], script)
    res = task.run(model, tok)
    assert [r["correct"] for r in res.details["items"]] == [False, False, False, True]
    assert res.details["items"][3]["stop"] == "eos"
    with pytest.raises(InvalidInput, match="mode"):
        GSM8KTask(mode="cot")
    with pytest.raises(ArtifactError, match="no GSM8K test data"):
        g8.load_gsm8k(tmp_path / "nothing")


def test_task_registry() -> None:
    assert TASKS.get("mmlu") is MMLUTask and TASKS.get("gsm8k") is GSM8KTask


def test_mmlu_parquet_through_datasets(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ref = mmlu.load_mmlu(write_mmlu_jsonl(tmp_path / "jsonl"))
    root = tmp_path / "parquet" / "all"
    root.mkdir(parents=True)
    for split in ("dev", "test"):
        rows = [
            {
                "question": it.question,
                "subject": it.subject,
                "choices": list(it.choices),
                "answer": it.answer,
            }
            for it in ref[split]
        ]
        pq.write_table(pa.Table.from_pylist(rows), root / f"{split}-00000-of-00001.parquet")
    assert mmlu.load_mmlu(tmp_path / "parquet") == ref
