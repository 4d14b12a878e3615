"""Run a script that compiles kernels offline for sm_90 (``introspect.compile_for``, Triton's own
ptxas) in a subprocess: without ``TRITON_INTERPRET``, so that the kernels are real
``JITFunction`` s even when the test session runs under the interpreter, and with the
repository's ``src`` first on the path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_offline(script: str, timeout: int = 600) -> str:
    """Run ``script`` (Python source) as above; returns its stdout, or fails the calling test
    with its last output if it exits non-zero."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout
