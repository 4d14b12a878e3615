"""Low-level safetensors and file handling shared by the artifact and Tetra formats: the dtype
table, a bounds-checked header parser, the tensor expectation check (dtype, shape, finiteness),
an fsync'ed write and the swap of a finished directory into place. Every failure is an
:class:`~leechq.errors.ArtifactError` naming the file and tensor."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from leechq.errors import ArtifactError

ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in ST_DTYPES.items()}


def fsync_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def parse_header(path: Path) -> dict[str, Any]:
    """Parse and bounds-check a safetensors header; errors name the file and the tensor."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ArtifactError(f"{path}: truncated ({size} bytes, no safetensors header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise ArtifactError(f"{path}: header length {n} exceeds the file size {size}")
            raw = fh.read(n)
    except OSError as exc:
        raise ArtifactError(f"{path}: unreadable: {exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"{path}: corrupt safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: safetensors header is not a JSON object")
    data_len = size - 8 - n
    end_max = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: tensor {name!r} has a malformed header entry") from exc
        if dtype not in ST_DTYPES:
            raise ArtifactError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ArtifactError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
        itemsize = torch.empty(0, dtype=ST_DTYPES[dtype]).element_size()
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= data_len):
            raise ArtifactError(
                f"{path}: tensor {name!r} lies outside the file (truncated or corrupt)"
            )
        if hi - lo != itemsize * math.prod(shape):
            raise ArtifactError(f"{path}: tensor {name!r} byte range does not match shape {shape}")
        end_max = max(end_max, hi)
    if end_max != data_len:
        raise ArtifactError(f"{path}: data section is {data_len} bytes but tensors cover {end_max}")
    return header


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file ``path`` (CPU, stored dtypes); a file safetensors cannot
    read raises :class:`ArtifactError` naming it."""
    try:
        from safetensors.torch import load_file

        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own types; name the file
        raise ArtifactError(f"{path}: unreadable safetensors: {exc}") from exc


def expect_tensor(
    tensors: Mapping[str, torch.Tensor],
    key: str,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    where: str,
) -> torch.Tensor:
    """``tensors[key]`` if present with ``dtype`` and ``shape`` and (floats) finite, else an
    :class:`ArtifactError` naming ``where`` and the tensor."""
    if key not in tensors:
        raise ArtifactError(f"{where}: missing tensor {key!r}")
    t = tensors[key]
    if t.dtype != dtype:
        raise ArtifactError(f"{where}: tensor {key!r} has dtype {t.dtype}, expected {dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ArtifactError(
            f"{where}: tensor {key!r} has shape {list(t.shape)}, expected {list(shape)}"
        )
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ArtifactError(f"{where}: tensor {key!r} has NaN or inf values")
    return t


class TensorFile:
    """One safetensors file opened for reading: its parsed ``header`` and every tensor
    (``tensors``, CPU, stored dtypes). :meth:`take` hands a tensor out by name with its dtype,
    shape and finiteness checked and remembers it; :meth:`check_all_taken` then refuses a file
    holding tensors that no descriptor took."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = parse_header(path)
        self.tensors = load_tensors(path)
        self._taken: set[str] = set()

    def take(self, key: str, dtype: torch.dtype, shape: tuple[int, ...], ctx: str) -> torch.Tensor:
        """``tensors[key]`` (``dtype``, ``shape``), else an :class:`ArtifactError` naming the file,
        ``ctx`` and the tensor."""
        t = expect_tensor(self.tensors, key, dtype, shape, f"{self.path} ({ctx})")
        self._taken.add(key)
        return t

    def check_all_taken(self, described_by: str) -> None:
        """Raise :class:`ArtifactError` if the file holds tensors never taken (naming up to four
        and ``described_by``, the file whose descriptors should have named them)."""
        extra = sorted(k for k in self.header if k != "__metadata__" and k not in self._taken)
        if extra:
            raise ArtifactError(f"{self.path}: {len(extra)} tensor(s) not described by "
                                f"{described_by}, e.g. {extra[:4]}")


def swap_into_place(tmp: Path, dest: Path, check_replaceable: Callable[[Path], None]) -> None:
    """Move the finished directory ``tmp`` to ``dest`` (the commit point of a write).

    An existing ``dest`` is checked again right before the swap (``check_replaceable`` raises if it
    is anything the writer may not replace), renamed aside, replaced, then deleted. Both paths are
    on one filesystem (``tmp`` is a sibling of ``dest``)."""
    if dest.exists():
        check_replaceable(dest)
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)


def existing_directory(out: str | os.PathLike[str], what: str) -> tuple[Path, str] | None:
    """The first check before replacing ``out`` with a ``what`` (e.g. "leechq artifact"): None when
    nothing is there; else ``(path, refusal)`` where ``refusal`` starts every error message.

    Raises:
        ArtifactError: ``out`` is a link or not a directory; nothing is touched."""
    path = Path(out)
    if not path.exists() and not path.is_symlink():
        return None
    refuse = f"{path} exists and is not a complete {what}; refusing to replace it"
    if path.is_symlink() or not path.is_dir():
        raise ArtifactError(f"{refuse} (it is not a directory)")
    return path, refuse
