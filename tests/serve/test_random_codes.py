"""Random-code models (``serve.random_codes``): groups drawn directly on the device compute from
their own records, in the layout asked for (``tetra48``, ``tetra64`` or the served default), through
the Triton interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.formats.layouts.tetra48 import Tetra48Weight
from leechq.formats.layouts.tetra64 import Tetra64Weight
from leechq.formats.rotation import generate_rotation
from leechq.nn.group import LeechqGroup

pytestmark = pytest.mark.interp


def _kernel_input(x: torch.Tensor, rot, n_blocks: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The activation the integer kernels multiply: ``Q x``, rounded as they round it."""
    from leechq.kernels import reference as kref
    from leechq.kernels.triton import ops

    return ops.kernel_activation(kref.rotate(x, rot), n_blocks)


def test_direct_ball_group_matches_its_records() -> None:
    """``direct`` ball groups: Planes14 records drawn on the device, one group per run, computing
    ``W·Q x`` from their own records."""
    from leechq.kernels import reference as kref
    from leechq.serve.random_codes import _direct_group, _DirectLattice

    rot = generate_rotation(72, 5)
    group = _direct_group([_DirectLattice(16, 72, rot, "ball"), _DirectLattice(8, 72, rot, "ball")],
                          "cpu", torch.float32, seed=2)
    assert isinstance(group, LeechqGroup) and group.layout == "planes14"
    assert group.execution.members == 2
    x = torch.randn(1, 72, generator=torch.Generator().manual_seed(3))
    want = kref.planes14_matvec(_kernel_input(x, rot, 3), group.parts[0])
    assert (group(x) - want).abs().max().item() <= 1e-5 * want.abs().max().item()


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_direct_tetra_group_in_tetra64(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """``layout="tetra64"`` draws the group's words into a ``Tetra64Weight`` and gives the
    ``tetra48`` group's outputs bit for bit (one and two rows on ``m1``, three on the int8 kernel,
    forced here as on a GPU); no layout follows the served default (``tetra48`` on the CPU)."""
    from leechq.kernels import select
    from leechq.serve.random_codes import _direct_group, _DirectLattice

    monkeypatch.setattr(select, "_interpreter_costs", lambda: False)  # the table as on a GPU
    rot = generate_rotation(72, 5)
    lattices = [_DirectLattice(16, 72, rot), _DirectLattice(8, 72, rot)]
    std = _direct_group(lattices, "cpu", torch.float32, seed=2, layout="tetra48")
    t64 = _direct_group(lattices, "cpu", torch.float32, seed=2, layout="tetra64")
    assert type(t64.parts[0]) is Tetra64Weight and t64.layout == "tetra64"
    assert type(std.parts[0]) is Tetra48Weight and std.layout == "tetra48"
    assert type(_direct_group(lattices, "cpu", torch.float32, seed=2).parts[0]) is Tetra48Weight
    x = torch.randn(rows, 72, generator=torch.Generator().manual_seed(rows))
    assert torch.equal(t64(x), std(x))


def test_random_model_builds_the_tetra64_type() -> None:
    """``random_quantized_model(direct=True, layout="tetra64")``: every lattice group of every
    block holds one ``Tetra64Weight`` part; ``layout`` without ``direct`` Tetra is refused."""
    from leechq.serve.random_codes import model_args, random_quantized_model

    args = model_args("qwen3-tiny")
    model = random_quantized_model(args, "cpu", torch.float32, direct=True, layout="tetra64")
    for blk in model.blocks:
        for proj in (blk.wqkv, blk.wo, blk.w13, blk.w2):
            assert isinstance(proj, LeechqGroup) and proj.segments == [-1]
            assert [type(p) for p in proj.parts] == [Tetra64Weight]
    with pytest.raises(InvalidInput, match="direct Tetra"):
        random_quantized_model(args, "cpu", torch.float32, layout="tetra64")
    with pytest.raises(InvalidInput, match="direct Tetra"):
        random_quantized_model(args, "cpu", torch.float32, direct=True, codebook="ball",
                               layout="tetra64")


@pytest.mark.gpu
def test_served_default_on_cuda_is_the_tetra64_type() -> None:
    """On a GPU with 16-bit activations a direct Tetra group is served as a ``Tetra64Weight``
    (``ops.t64_serving``) and gives the ``tetra48`` group's outputs bit for bit at one row (the
    ``m1`` kernel on both layouts)."""
    from leechq.kernels.triton import ops
    from leechq.serve.random_codes import _direct_group, _DirectLattice

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rot = generate_rotation(4096, 5)
    lattices = [_DirectLattice(1024, 4096, rot), _DirectLattice(512, 4096, rot)]
    served = _direct_group(lattices, "cuda", torch.float16, seed=4)
    std = _direct_group(lattices, "cuda", torch.float16, seed=4, layout="tetra48")
    want = Tetra64Weight if ops.t64_serving("cuda") else Tetra48Weight
    assert type(served.parts[0]) is want and type(std.parts[0]) is Tetra48Weight
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    assert torch.equal(served(x), std(x))
