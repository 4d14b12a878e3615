"""Locate, or fetch and extract, one Debian package's files for an offline corpus.

A corpus backed by a Debian package (:class:`DebianFiles`) is looked for, in order:

1. ``$LEECHQ_CORPUS_DIR/<corpus>`` when ``$LEECHQ_CORPUS_DIR`` is set (an error if it is missing;
   the variable is the one offline switch for every corpus, :func:`corpus_dir_override`);
2. the installed package's directory, for a corpus that names one;
3. the cache ``<cache root>/<corpus>/<package>/<sub>`` (with its ``manifest.json``);
4. otherwise fetched into that cache: ``apt-get download <package>`` (no root needed; or a local
   ``.deb``), the matching members of its ``data.tar.*`` extracted in Python (ar + tarfile; no
   ``dpkg`` needed) into a temporary sibling, a manifest written (package, ``.deb`` name, version,
   the ``.deb``'s sha256), then renamed into place.

Every failure is an :class:`~leechq.errors.ArtifactError` naming the package and ending with what
an offline user can do instead (:func:`offline_hint`).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from leechq.data.cache import cache_root
from leechq.errors import ArtifactError
from leechq.utils.hashing import sha256_file

MANIFEST = "manifest.json"
"""The file, next to the extracted folder, recording what was extracted from which ``.deb``."""
CORPUS_DIR_ENV = "LEECHQ_CORPUS_DIR"
"""The environment variable naming a directory of offline corpora: ``pydoc/`` (laid out like the
docs' ``html/_sources``), ``pycode/`` (laid out like ``usr/lib/python3.11``) and/or ``fortunes/``
(the topic files)."""


def corpus_dir_override(name: str) -> Path | None:
    """``$LEECHQ_CORPUS_DIR/<name>`` when the variable is set, else None.

    Args:
        name: the corpus subdirectory (``"pydoc"``, ``"pycode"`` or ``"fortunes"``).

    Raises:
        ArtifactError: the variable is set but ``<dir>/<name>`` is not a directory.
    """
    env = os.environ.get(CORPUS_DIR_ENV)
    if not env:
        return None
    p = Path(env).expanduser() / name
    if not p.is_dir():
        raise ArtifactError(
            f"${CORPUS_DIR_ENV}={env!r} has no {name}/ directory ({p} is not a directory); "
            f"put the {name} corpus there or unset ${CORPUS_DIR_ENV}"
        )
    return p


def offline_hint(package: str, fetch: str, subdir: str, layout: str) -> str:
    """What an offline user can do instead of ``apt-get download`` (for error messages)."""
    return (
        f"download {package}_*.deb from a Debian mirror and call {fetch}(deb=PATH), or set "
        f"${CORPUS_DIR_ENV} to a directory holding {subdir}/ laid out like {layout}"
    )


@dataclass(frozen=True)
class DebianFiles:
    """The files of one Debian package used as a corpus.

    Attributes:
        package: the Debian package (``apt-get download`` name).
        corpus: the ``$LEECHQ_CORPUS_DIR`` subdirectory and cache folder (``"pydoc"``).
        sub: the folder under the cache directory that receives the members (``"_sources"``).
        prefix: the members taken are the files under this path of the data archive...
        suffix: ...whose name ends with this (``""``: any)...
        skip: ...except those whose path relative to ``prefix`` starts with one of these.
        fetch_name: the dotted name of the corpus's public fetch function (for messages).
        layout: how a ``$LEECHQ_CORPUS_DIR/<corpus>`` directory is laid out (for messages).
        what: what the files are, in messages (``"sources"``, ``"texts"``).
    """

    package: str
    corpus: str
    sub: str
    prefix: str
    suffix: str
    fetch_name: str
    layout: str
    what: str = "sources"
    skip: tuple[str, ...] = ()

    def cache_dir(self) -> Path:
        """``<cache root>/<corpus>/<package>``: the manifest and the ``sub`` folder."""
        return cache_root() / self.corpus / self.package

    def hint(self) -> str:
        """What an offline user can do instead of ``apt-get download`` (ends error messages)."""
        return offline_hint(self.package, self.fetch_name, self.corpus, self.layout)

    def locate(self, *, fetch: bool = True, system: Path | None = None) -> Path:
        """The directory of the files: override, installed ``system`` copy, cache, else fetched.

        Args:
            fetch: allow downloading and extracting the ``.deb`` when no copy is found.
            system: where the installed package keeps the files (None: not looked for).

        Raises:
            ArtifactError: ``$LEECHQ_CORPUS_DIR`` lacks ``<corpus>/``, no copy found and
                ``fetch`` is False, or fetching failed.
        """
        override = corpus_dir_override(self.corpus)
        if override is not None:
            return override
        if system is not None and system.is_dir():
            return system
        cached = self.cache_dir()
        if (cached / MANIFEST).is_file() and (cached / self.sub).is_dir():
            return cached / self.sub
        if not fetch:
            places = ([f"not installed at {system}"] if system is not None else [])
            places.append(f"not cached at {cached}")
            raise ArtifactError(
                f"no copy of the {self.package} {self.what}: {', '.join(places)}; call "
                f"{self.fetch_name.rsplit('.', 1)[-1]}(), or {self.hint()}"
            )
        return self.fetch()

    def fetch(self, deb: Path | str | None = None) -> Path:
        """Extract the members into the cache atomically; return ``cache_dir() / sub``.

        A temporary sibling receives the members and the manifest (package, ``.deb`` name,
        version, the ``.deb``'s sha256), then is renamed into place; a concurrent fetch that
        finished first wins.

        Args:
            deb: a local ``.deb`` to extract (left in place); default ``apt-get download``.

        Raises:
            ArtifactError: apt-get is missing or fails, or the ``.deb`` holds no matching member.
        """
        dest = self.cache_dir()
        dest.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".fetch-"))
        try:
            deb_path = Path(deb) if deb else _apt_download(work, self.package, self.hint())
            version = _extract_sources(
                deb_path, work / self.sub, self.prefix, self.suffix, self.skip
            )
            manifest = {
                "package": self.package,
                "deb": deb_path.name,
                "version": version,
                "deb_sha256": sha256_file(deb_path),
            }
            (work / MANIFEST).write_text(json.dumps(manifest, indent=1))
            if not deb:
                deb_path.unlink()
            os.chmod(work, 0o755)
            if (dest / MANIFEST).is_file():  # another process finished first
                return dest / self.sub
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(work, dest)
            return dest / self.sub
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _apt_download(work: Path, package: str, hint: str) -> Path:
    """``apt-get download package`` into ``work``; the path of the ``.deb``. ``hint`` (see
    :func:`offline_hint`) ends the error messages."""
    if shutil.which("apt-get") is None:
        raise ArtifactError(f"apt-get not found: {hint}")
    proc = subprocess.run(
        ["apt-get", "download", package], cwd=work, capture_output=True, text=True
    )
    debs = sorted(work.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not debs:
        raise ArtifactError(
            f"apt-get download {package} failed (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-1000:]}; {hint}"
        )
    return debs[0]


def _ar_members(data: bytes) -> dict[str, bytes]:
    """Members of a Unix ar archive (the container format of a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise ArtifactError("not a .deb (ar) archive: bad magic")
    out: dict[str, bytes] = {}
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        pos += 60
        out[name] = data[pos : pos + size]
        pos += size + (size & 1)
    return out


def _extract_sources(
    deb: Path,
    dest: Path,
    prefix: str,
    suffix: str,
    skip: tuple[str, ...] = (),
) -> str:
    """Extract the ``*<suffix>`` files under ``prefix`` of a .deb into ``dest``, except those whose
    path relative to ``prefix`` starts with one of ``skip``; return the package version."""
    members = _ar_members(deb.read_bytes())
    data_name = next((n for n in members if n.startswith("data.tar")), None)
    if data_name is None:
        raise ArtifactError(f"{deb}: no data.tar member")
    version = ""
    control_name = next((n for n in members if n.startswith("control.tar")), None)
    if control_name is not None:
        with tarfile.open(fileobj=io.BytesIO(members[control_name]), mode="r:*") as ctl:
            for m in ctl.getmembers():
                if m.name.lstrip("./") == "control" and m.isfile():
                    text = ctl.extractfile(m).read().decode("utf-8")  # type: ignore[union-attr]
                    for line in text.splitlines():
                        if line.startswith("Version:"):
                            version = line.split(":", 1)[1].strip()
    n = 0
    with tarfile.open(fileobj=io.BytesIO(members[data_name]), mode="r:*") as tar:
        for m in tar.getmembers():
            name = m.name.removeprefix("./")
            if not (name.startswith(prefix) and name.endswith(suffix) and m.isfile()):
                continue
            rel = name[len(prefix) :]
            if rel.startswith(skip):
                continue
            if rel.startswith("/") or ".." in rel.split("/"):
                raise ArtifactError(f"{deb}: unsafe member path {m.name!r}")
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(m).read())  # type: ignore[union-attr]
            n += 1
    if n == 0:
        raise ArtifactError(f"{deb}: no {prefix}*{suffix} members")
    return version
