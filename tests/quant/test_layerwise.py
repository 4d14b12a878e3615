"""The generic sequential driver: sequential semantics, resumability (P12), progress totals (P4)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from standin_codebook import NAME, registered

from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import rotation_seed
from leechq.quant.layerwise import LinearSpec, Progress, quantize_blocks


@pytest.fixture(autouse=True)
def _standin() -> Iterator[str]:
    with registered() as name:
        yield name


class ToyBlock:
    """x + down(relu(gate(x)) * up(x)): three linears over two distinct inputs (acts 2 and 3)."""

    def __init__(self, index: int, d: int = 48, hidden: int = 72, seed: int = 0):
        g = torch.Generator().manual_seed(seed + index)
        self.index = index
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)
        for lin in (self.gate, self.up, self.down):
            with torch.no_grad():
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.1)
        p = f"layers.{index}.mlp"
        self.linears = [
            LinearSpec(f"{p}.gate_proj", self.gate, 2),
            LinearSpec(f"{p}.up_proj", self.up, 2),
            LinearSpec(f"{p}.down_proj", self.down, 3),
        ]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.down(torch.relu(self.gate(hidden)) * self.up(hidden))

    @contextmanager
    def activate(self, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
        yield


def _states(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 16, 48, generator=g) for _ in range(3)]


CFG = QuantConfig(codebook=NAME, calib_windows=6, calib_window_len=16, device="cpu")


def _run(tmp: Path | None, cfg: QuantConfig = CFG, on_block=None, n: int = 3):  # type: ignore[no-untyped-def]
    blocks = [ToyBlock(i) for i in range(n)]
    states = _states()
    res = quantize_blocks(
        blocks, states, cfg, checkpoint_dir=tmp, progress=False, on_block=on_block
    )
    return blocks, states, res


def test_sequential_semantics_and_effective_seeds() -> None:
    blocks, states, res = _run(None)
    assert list(res.records) == [s.name for b in blocks for s in b.linears]
    for t, b in enumerate(blocks):
        for spec in b.linears:
            rec = res.records[spec.name]
            assert isinstance(rec, QuantizedWeight)
            assert rec.rotation is not None and rec.rotation.seed == rotation_seed(t, spec.act)
            assert torch.equal(
                spec.module.weight, rec.dequantize()
            )  # P13: the module holds the decode
    # the returned states went through the quantized blocks
    want = _states()
    for b in blocks:
        want = [b.forward(s) for s in want]
    assert all(torch.equal(a, w) for a, w in zip(states, want, strict=True))
    # block 1 saw block 0's *quantized* output: replaying block 1 alone on original-block-0 output
    # differs
    blocks2 = [ToyBlock(i) for i in range(3)]
    s0 = [blocks2[0].forward(s) for s in _states()]  # original block 0
    res2 = quantize_blocks(
        [_reindexed(blocks2[1], 0)],
        s0,
        CFG.replace(rotation_seed=CFG.rotation_seed ^ (1 << 32)),
        progress=False,
    )
    assert not torch.equal(
        res2.records["layers.1.mlp.down_proj"].labels, res.records["layers.1.mlp.down_proj"].labels
    )


def _reindexed(block: ToyBlock, index: int) -> ToyBlock:
    block.index = index
    return block


def test_int4_modules_and_stats() -> None:
    blocks = [ToyBlock(i) for i in range(2)]
    for b in blocks:
        b.linears[2].int4 = True
    res = quantize_blocks(blocks, _states(), CFG, progress=False)
    assert isinstance(res.records["layers.0.mlp.down_proj"], Int4Weight)
    assert isinstance(res.records["layers.1.mlp.up_proj"], QuantizedWeight)
    st = res.stats["layers.0.mlp.gate_proj"]
    assert 0.0 < st["rel_err"] < 1.0 and 0.0 < st["proxy"] < 1.0


def test_resume_after_a_crash_gives_identical_records(tmp_path: Path) -> None:
    _, states_full, full = _run(None)

    class Crash(RuntimeError):
        pass

    def crash_after_block_1(t: int) -> None:
        if t == 1:
            raise Crash

    ck = tmp_path / "ckpt"
    with pytest.raises(Crash):
        _run(ck, on_block=crash_after_block_1)
    run = json.loads((ck / "run.json").read_text())
    assert run["done"] == 2 and not (ck / "states_0000.safetensors").exists()
    blocks, states, resumed = _run(ck)
    assert resumed.resumed_blocks == 2
    assert list(resumed.records) == list(full.records)
    for name, rec in full.records.items():
        other = resumed.records[name]
        assert isinstance(rec, QuantizedWeight) and isinstance(other, QuantizedWeight)
        assert torch.equal(rec.labels, other.labels) and torch.equal(rec.gains, other.gains)
        assert torch.equal(rec.dequantize(), other.dequantize())
    assert all(torch.equal(a, b) for a, b in zip(states, states_full, strict=True))
    # resumed blocks got their decoded weights back
    assert torch.equal(
        blocks[0].linears[0].module.weight, full.records["layers.0.mlp.gate_proj"].dequantize()
    )


def test_resume_refuses_a_different_configuration(tmp_path: Path) -> None:
    def stop(t: int) -> None:
        raise KeyboardInterrupt

    ck = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        _run(ck, on_block=stop)
    with pytest.raises(InvalidInput, match="different run"):
        _run(ck, cfg=CFG.replace(damping=0.02))
    with pytest.raises(InvalidInput, match="different run"):
        _run(ck, n=2)


def test_progress_counts_matrices_and_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = [ToyBlock(i) for i in range(2)]
    quantize_blocks(blocks, _states(), CFG, progress=True)
    err = capsys.readouterr().err
    assert "block 2/2" in err and "6/6" in err and "/405" not in err
    p = Progress(36, 252, enabled=False, initial=14)
    p.step()
    assert (p.total, p.done) == (252, 15)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidInput, match="at least one block"):
        quantize_blocks([], _states(), CFG, progress=False)
    with pytest.raises(InvalidInput, match="hidden states"):
        quantize_blocks([ToyBlock(0)], [], CFG, progress=False)
    with pytest.raises(InvalidInput, match="reports index"):
        quantize_blocks([ToyBlock(1)], _states(), CFG, progress=False)


def test_background_commit_errors_reach_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoint writes overlap the next block; a failed write is raised, never swallowed, and
    every block reported by on_block is on disk."""
    from leechq.quant.layerwise import Checkpoint

    seen: list[int] = []
    calls = {"n": 0}
    real_write = Checkpoint.write

    def flaky(self, *job):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        real_write(self, *job)

    monkeypatch.setattr(Checkpoint, "write", flaky)

    def record(t: int) -> None:
        seen.append(t)
        assert json.loads((tmp_path / "ck" / "run.json").read_text())["done"] == t + 1

    with pytest.raises(OSError, match="disk full"):
        _run(tmp_path / "ck", on_block=record)
    assert seen == [0]
    assert json.loads((tmp_path / "ck" / "run.json").read_text())["done"] == 1
