"""Safe writing of an output directory (a leechq artifact, a Tetra directory): refusing a bad
destination before any work is done (:func:`check_output_path`), replacing only a complete leechq
artifact we wrote (:func:`check_replaceable`), and the hidden ``.<name>.partial-<pid>`` directory a
writer assembles in (:func:`partial_directory`), with what killed writers left cleaned up first
(:func:`clean_stale_partials`). The swap into place is
:func:`leechq.formats.safetensors_io.swap_into_place`; the rules are docs/integrity.md's
"Writing" section."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

from leechq.errors import ArtifactError
from leechq.formats.integrity import load_json, verify_manifest
from leechq.formats.safetensors_io import existing_directory

MAX_OUT_NAME_BYTES = 255 - 24  # room for ".<name>.partial-<pid>" and "<name>.rows-ckpt"


def check_output_path(out: str | os.PathLike[str]) -> None:
    """Refuse an output directory that cannot be written, before any work is done.

    Raises:
        ArtifactError: an empty name, a name longer than :data:`MAX_OUT_NAME_BYTES` bytes (the
            temporary and checkpoint names add to it), or a nearest existing ancestor that is not
            a writable directory.
    """
    path = Path(out)
    name = path.name
    if not name or name in (".", ".."):
        raise ArtifactError(f"{out!s}: not a usable directory name")
    if len(os.fsencode(name)) > MAX_OUT_NAME_BYTES:
        raise ArtifactError(
            f"output name {name[:40]}... is {len(os.fsencode(name))} bytes; at most "
            f"{MAX_OUT_NAME_BYTES} fit the file system with the temporary and checkpoint suffixes"
        )
    try:
        anc = path.absolute().parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        usable = anc.is_dir() and os.access(anc, os.W_OK | os.X_OK)
    except OSError as exc:
        raise ArtifactError(f"{out!s}: cannot be created: {exc}") from exc
    if not anc.is_dir():
        raise ArtifactError(f"{out!s}: cannot be created: {anc} is not a directory")
    if not usable:
        raise ArtifactError(f"{out!s}: cannot be created: {anc} is not writable")


def check_replaceable(out: str | os.PathLike[str]) -> None:
    """Refuse to replace ``out`` unless it is a complete leechq artifact and nothing else.

    ``out`` may be replaced (``overwrite=True``, ``--force``) only when it is a real directory
    (not a link) whose ``leechq-manifest.json`` is valid, names ``quant_method`` "leechq", lists
    every file the directory holds, and whose listed files have their recorded sizes. A folder of
    the user's files, a file, or an artifact with foreign files added is never deleted.

    Raises:
        ArtifactError: ``out`` is not such a directory (the reason named); nothing is touched.
    """
    # the artifact imports this module to write; its file names are read here at call time
    from leechq.formats.artifact import CONFIG_FILE, MANIFEST_FILE, MODEL_FILE, QUANT_METHOD

    found = existing_directory(out, "leechq artifact")
    if found is None:
        return
    path, refuse = found
    try:
        manifest = load_json(path / MANIFEST_FILE)
    except ArtifactError as exc:
        raise ArtifactError(f"{refuse} ({MANIFEST_FILE}: {exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("quant_method") != QUANT_METHOD:
        raise ArtifactError(f"{refuse} (its manifest is not a leechq manifest)")
    try:
        files = verify_manifest(path, MANIFEST_FILE, (CONFIG_FILE, MODEL_FILE), verify=False)
    except ArtifactError as exc:
        raise ArtifactError(f"{refuse} ({exc})") from exc
    foreign = sorted(
        p.name for p in path.iterdir() if p.name not in files and p.name != MANIFEST_FILE
    )
    if foreign:
        raise ArtifactError(f"{refuse} (it holds files the manifest does not list: {foreign[:3]})")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def clean_stale_partials(out: str | os.PathLike[str]) -> list[Path]:
    """Remove what a killed write of ``out`` left behind; returns the paths handled.

    A writer assembles ``.<name>.partial-<pid>`` and, when replacing, moves the old artifact to
    ``.<name>.old-<pid>``. For a writer whose process is gone: a partial directory is deleted (it
    was never committed); an old artifact is put back when ``out`` is missing (the writer died
    between its two renames), else deleted. Directories of a live process are left alone.
    """
    path = Path(out)
    parent = path.parent
    handled: list[Path] = []
    if not parent.is_dir():
        return handled
    for kind in ("partial", "old"):
        prefix = f".{path.name}.{kind}-"
        for p in sorted(parent.glob(f"{glob.escape(prefix)}*")):
            tail = p.name[len(prefix):]
            if not tail.isdigit() or _pid_alive(int(tail)) or not p.is_dir() or p.is_symlink():
                continue
            if kind == "old" and not path.exists():
                os.replace(p, path)
            else:
                shutil.rmtree(p, ignore_errors=True)
            handled.append(p)
    return handled


def partial_directory(dest: Path, what: str) -> Path:
    """A new empty ``.<name>.partial-<pid>`` directory beside ``dest``, for a writer to assemble
    ``dest`` in before :func:`~leechq.formats.safetensors_io.swap_into_place` commits it; what
    killed earlier writes of ``dest`` left is cleaned first (:func:`clean_stale_partials`). Raises
    :class:`ArtifactError` naming ``dest`` and ``what`` (the thing written) when the directory
    cannot be made."""
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_partials(dest)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as exc:
        raise ArtifactError(f"{dest}: cannot create the {what} here: {exc}") from exc
    return tmp
