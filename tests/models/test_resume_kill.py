"""Resume after a real ``kill -9`` in a subprocess, and a stale source never reuses a checkpoint.

The child quantizes a tiny Llama (stand-in codebook, fast) with a checkpoint directory and stops
itself after block 1 is committed; the parent kills it with SIGKILL, then finishes the run from the
checkpoint: the artifact is byte-identical to an uninterrupted run. Editing one weight of the
source after the kill changes the resume key (the full content hash of every source tensor), so
the old checkpoint is refused instead of reused.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))
from standin_codebook import register, registered

from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.artifact import read_artifact
from leechq.models.quantize import _model_fingerprint, quantize_model

transformers = pytest.importorskip("transformers")

CHILD = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, {quant!r})
sys.path.insert(0, {here!r})
from standin_codebook import registered
from test_resume_kill import llama, windows, config
from leechq.models.quantize import quantize_model_in_place

def stop(t):
    if t == 1:
        Path({marker!r}).write_text("1")
        time.sleep(120)  # killed here, after block 1 is committed

with registered():
    quantize_model_in_place(llama(), windows(), config(), progress=False,
                            checkpoint_dir={ckpt!r}, on_block=stop)
"""


@pytest.fixture(autouse=True)
def _standin() -> Iterator[str]:
    with registered() as name:
        yield name


def llama():  # type: ignore[no-untyped-def]
    """A 3-layer, 48-wide random Llama (seeded)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def windows() -> torch.Tensor:
    return torch.randint(0, 128, (5, 24), generator=torch.Generator().manual_seed(0))


def config() -> QuantConfig:
    return QuantConfig(
        codebook=register(), calib_windows=5, calib_window_len=24, calib_batch=2, device="cpu"
    )


def _kill_after_block_1(ckpt: Path, tmp_path: Path) -> None:
    marker = tmp_path / "block1.done"
    code = CHILD.format(
        quant=str(Path(__file__).resolve().parents[1] / "quant"),
        here=str(Path(__file__).resolve().parent),
        marker=str(marker),
        ckpt=str(ckpt),
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, f"child exited early with {proc.returncode}"
            assert time.monotonic() < deadline, "child never committed block 1"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory whose writer was killed with SIGKILL after block 1."""
    tmp = tmp_path_factory.mktemp("killed")
    with registered():
        _kill_after_block_1(tmp / "run.ckpt", tmp)
    return tmp / "run.ckpt"


def test_kill_9_then_resume_is_byte_identical(killed: Path, tmp_path: Path) -> None:
    clean = quantize_model(llama(), None, windows(), config(), tmp_path / "clean", progress=False)
    ckpt = Path(shutil.copytree(killed, tmp_path / "run.ckpt"))
    assert (ckpt / "run.json").is_file()
    resumed = quantize_model(
        llama(), None, windows(), config(), tmp_path / "resumed", progress=False,
        checkpoint_dir=ckpt,
    )
    assert read_artifact(resumed).quantization_config["provenance"]["resumed_blocks"] == 2
    assert (resumed / "model.safetensors").read_bytes() == (
        clean / "model.safetensors"
    ).read_bytes()


def test_stale_source_never_reuses_the_checkpoint(killed: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(killed, tmp_path / "run.ckpt"))
    edited = llama()
    with torch.no_grad():  # one value in the middle of a tensor: the sampled fingerprint missed it
        w = edited.model.layers[0].mlp.down_proj.weight
        w.view(-1)[w.numel() // 2] += 0.25
    with pytest.raises(InvalidInput, match="different run"):
        quantize_model(
            edited, None, windows(), config(), tmp_path / "out", progress=False,
            checkpoint_dir=ckpt,
        )
    assert not (tmp_path / "out").exists()


def test_fingerprint_covers_every_value() -> None:
    a, b = llama(), copy.deepcopy(llama())
    assert _model_fingerprint(a) == _model_fingerprint(b)
    with torch.no_grad():
        p = b.model.layers[1].self_attn.k_proj.weight
        p.view(-1)[17] = torch.nextafter(p.view(-1)[17], torch.tensor(1.0))  # one ulp
    assert _model_fingerprint(a) != _model_fingerprint(b)
