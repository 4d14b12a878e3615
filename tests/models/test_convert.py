"""Published Tetra checkpoints: ``leechq convert`` is lossless, and ``leechq.load`` / the CLI /
``from_pretrained`` give the logits ``llvq-tetra``'s own transformers path gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from leechq_tiny import ids, make_tetra_dir

import leechq.integrations.transformers  # noqa: F401  (registers quant_method "leechq")
from leechq.cli.main import main
from leechq.errors import ArtifactError, InvalidInput
from leechq.formats.artifact import read_artifact
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.models.convert import is_tetra_dir, tetra_dir_to_artifact
from leechq.models.load import load

llvq_tetra = pytest.importorskip("llvq_tetra")
transformers = pytest.importorskip("transformers")


def _tetra_dir(tmp: Path, arch: str) -> Path:
    """A Tetra checkpoint written by leechq's published-format writer
    (:func:`leechq_tiny.make_tetra_dir`)."""
    return make_tetra_dir(tmp, arch)[1]


def _llvq_logits(path: Path, x: torch.Tensor) -> torch.Tensor:
    if getattr(llvq_tetra, "_quantizer", None) is None:
        pytest.skip("llvq_tetra skipped its transformers registration")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(x).logits


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tetra_checkpoint_loads_converts_and_matches_llvq_tetra(tmp_path: Path, arch: str) -> None:
    src = _tetra_dir(tmp_path, arch)
    proc = subprocess.run(
        [sys.executable, "-m", "llvq_tetra.checkdense", str(src)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert is_tetra_dir(src) and not is_tetra_dir(tmp_path / f"art-{arch}")
    x = ids()
    want = _llvq_logits(src, x)
    tol = dict(rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    # leechq.load on the Tetra directory itself (converted on the fly)
    direct, tok = load(src, device="cpu")
    assert tok is not None
    with torch.no_grad():
        torch.testing.assert_close(direct(x).logits, want, **tol)
    # leechq convert: field-for-field records, then from_pretrained and leechq.load
    out = tmp_path / "converted"
    assert main(["convert", str(src), str(out)]) == 0
    from leechq.formats.tetra_read import read_tetra_dir

    d, art = read_tetra_dir(src), read_artifact(out)
    assert set(art.records) == set(d.records)
    for name, rec in d.records.items():
        got = art.records[name]
        assert type(got) is type(rec)
        fields = ("labels", "gains", "row_scales", "centroids", "tail")
        if isinstance(rec, QuantizedWeight):
            assert all(torch.equal(getattr(got, f), getattr(rec, f)) for f in fields), name
            assert got.rotation.seed == rec.rotation.seed
        else:
            assert torch.equal(got.qweight, rec.qweight) and torch.equal(got.scales, rec.scales)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, want, **tol)
    # the CLI runs the Tetra directory directly
    assert (
        main(["run", str(src), "--prompt", "the water", "--max-new-tokens", "2", "--device", "cpu"])
        == 0
    )


def test_convert_refusals(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a Tetra checkpoint"):
        from leechq.cli.convert import run

        run(
            type(
                "A",
                (),
                {
                    "source": str(tmp_path),
                    "out": str(tmp_path / "o"),
                    "force": False,
                    "verify_dense": False,
                },
            )()
        )
    src = _tetra_dir(tmp_path, "llama")
    tetra_dir_to_artifact(src, tmp_path / "o")
    with pytest.raises(ArtifactError, match="already exists"):
        tetra_dir_to_artifact(src, tmp_path / "o")
    (src / "model.safetensors").write_bytes(b"broken")
    with pytest.raises(ArtifactError):
        load(src, device="cpu")


@pytest.mark.gpu
def test_tetra_checkpoint_on_cuda_runs_the_fused_kernels(tmp_path: Path) -> None:
    """On a GPU the converted checkpoint is served by the fused kernels and still gives
    llvq-tetra's logits (bf16 activations: compared by cosine)."""
    from leechq.nn.linear import LeechqLinear

    src = _tetra_dir(tmp_path, "qwen3")
    x = ids()
    want = _llvq_logits(src, x)
    model, _ = load(src, device="cuda", dtype=torch.bfloat16)
    paths = {m.execution.path for m in model.modules() if isinstance(m, LeechqLinear)}
    assert paths == {"fused"}, paths
    with torch.no_grad():
        got = model(x.cuda()).logits.float().cpu()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cos) >= 0.999
