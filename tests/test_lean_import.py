"""`import leechq` must not import triton/transformers nor touch CUDA (architecture rule A2)."""

from __future__ import annotations

import subprocess
import sys


def test_import_leechq_is_lean() -> None:
    code = (
        "import sys, leechq\n"
        "bad = [m for m in ('triton', 'transformers', 'vllm', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(leechq.__version__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_subpackages_do_not_initialize_cuda() -> None:
    code = (
        "import sys, leechq, leechq.lattice, leechq.codebooks\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
        "assert 'triton' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
