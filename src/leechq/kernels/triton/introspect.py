"""Ahead-of-time compilation of the kernels for a chosen GPU target, and SASS instruction counts.

Uses Triton's bundled ``ptxas``/``cuobjdump`` (no GPU needed): ``compile_for(kernel, signature,
constexprs, arch=90)`` returns the compiled object (``.asm['ptx']``, ``['cubin']``, metadata with
registers/spills where the backend reports them); :func:`sass` disassembles the cubin;
:func:`loop_mix` counts the instructions inside the hottest loop (the longest backward branch)
grouped by opcode. Used by benchmarks/bench_matvec.py to report instruction counts beside times.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from typing import Any

M1_SIGNATURE = {
    "xp_ptr": "*fp32", "w_ptr": "*i32", "scale_ptr": "*fp32", "cent_ptr": "*fp32",
    "tail_ptr": "*fp32", "tab_ptr": "*i32", "part_ptr": "*fp32", "cnt_ptr": "*i32",
    "y_ptr": "*fp32", "d_out": "i32", "stride_x": "i32", "stride_y": "i32", "m_rows": "i32",
}
"""The runtime parameters of ``tetra48_m1.m1_kernel`` for :func:`compile_for`."""

ROTATE_PREPARED_SIGNATURE = {
    "x_ptr": "*fp32", "stride_xm": "i32", "signs_ptr": "*fp32", "small_ptr": "*fp32",
    "out_ptr": "*fp32", "stride_om": "i32", "order_ptr": "*i32", "inv_sqrt_m": "fp32",
    "M": "i32", "aux_ptr": "*fp32", "stride_am": "i32", "w_ptr": "*fp32", "res_ptr": "*fp32",
    "stride_rm": "i32", "eps": "fp32", "rec_ptr": "*i32", "ex_ptr": "*fp32",
}
"""The runtime parameters of ``activation.rotate_prepared_kernel`` for :func:`compile_for`."""

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def compile_for(kernel: Any, signature: dict[str, str], constexprs: dict[str, Any],
                arch: int = 90, num_warps: int = 4, maxnreg: int = 0,
                aligned_ints: tuple[str, ...] = ()) -> Any:
    """Compile ``kernel`` for ``sm_<arch>`` without launching it (``maxnreg``: register cap per
    thread, 0 for the compiler's choice).

    Like a launch with torch tensors, every pointer argument is marked 16-byte aligned, and so is
    each integer argument named in ``aligned_ints`` (a launch marks the integers whose value is a
    multiple of 16). These hints steer Triton's layout choices: a kernel compiled without them can
    differ from the one a launch builds (e.g. in whether it moves data through shared memory).

    Constexpr parameters not in ``constexprs`` take their defaults, as in a launch (Triton's
    ``ASTSource`` does not apply them: a branch on an unset constexpr compiles the wrong arm)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = dict(constexprs)
    for name, param in inspect.signature(kernel.fn).parameters.items():
        if (name not in constexprs and param.default is not inspect.Parameter.empty
                and "constexpr" in str(param.annotation)):
            constexprs[name] = param.default
    sig = dict(signature)
    for k in constexprs:
        sig[k] = "constexpr"
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]]
             for name, kind in signature.items()
             if kind.startswith("*") or name in aligned_ints}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    options: dict[str, Any] = {"num_warps": num_warps}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass(compiled: Any) -> str:
    """SASS text of a compiled kernel (cuobjdump from Triton's package, or on the PATH)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
        path = f.name
    try:
        for exe in (_tool("cuobjdump"), "cuobjdump"):
            try:
                return subprocess.run([exe, "-sass", path], capture_output=True, text=True,
                                      check=True).stdout
            except (OSError, subprocess.CalledProcessError):
                continue
        raise RuntimeError("cuobjdump not found")
    finally:
        os.unlink(path)


def resource_usage(compiled: Any) -> dict[str, int]:
    """Registers, shared memory, stack and local memory per thread from ``cuobjdump -res-usage``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
        path = f.name
    try:
        text = ""
        for exe in (_tool("cuobjdump"), "cuobjdump"):
            try:
                text = subprocess.run([exe, "-res-usage", path], capture_output=True, text=True,
                                      check=True).stdout
                break
            except (OSError, subprocess.CalledProcessError):
                continue
    finally:
        os.unlink(path)
    out = {}
    for key, name in (("REG", "registers"), ("STACK", "stack"), ("SHARED", "shared"),
                      ("LOCAL", "local")):
        m = re.search(key + r":(\d+)", text)
        if m:
            out[name] = int(m.group(1))
    return out


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each SASS instruction."""
    out = []
    for m in _LINE.finditer(text):
        out.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def widest_loop(ins: list[tuple[int, str, str]]) -> tuple[int, int]:
    """(first, last) address of the widest backward ``BRA`` loop in :func:`instructions` output;
    (0, 0) when there is none."""
    best = (0, 0)
    for addr, op, args in ins:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", args)
            if m:
                target = int(m.group(1), 16)
                if target < addr and addr - target > best[1] - best[0]:
                    best = (target, addr)
    return best


def loop_mix(text: str) -> dict[str, Any]:
    """Opcode counts inside the largest loop (the widest backward ``BRA``), and in the whole kernel."""
    ins = instructions(text)
    best = widest_loop(ins)
    body = [op for addr, op, _ in ins if best[0] <= addr <= best[1]]
    base = lambda op: op.split(".")[0]  # noqa: E731
    return {
        "loop_bytes": best[1] - best[0],
        "loop": dict(Counter(base(op) for op in body).most_common()),
        "loop_total": len(body),
        "kernel_total": len([1 for _, op, _ in ins if op != "NOP"]),
    }


def hot_loop_mix(text: str) -> dict[str, Any]:
    """Like :func:`loop_mix`, minus the largest forward-branch region inside the loop (a per-chunk
    epilogue such as the ``m1`` kernels' ticket and fixup, which runs once per chunk, not per
    iteration); ``skipped`` is its instruction count."""
    ins = instructions(text)
    best = widest_loop(ins)
    skip = (0, 0)
    for addr, op, args in ins:
        if best[0] <= addr <= best[1] and op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", args)
            if m:
                target = int(m.group(1), 16)
                if addr < target <= best[1] and target - addr > skip[1] - skip[0]:
                    skip = (addr, target)
    body = [op for addr, op, _ in ins
            if best[0] <= addr <= best[1] and not skip[0] < addr < skip[1]]
    base = lambda op: op.split(".")[0]  # noqa: E731
    return {
        "loop_bytes": best[1] - best[0],
        "loop": dict(Counter(base(op) for op in body).most_common()),
        "loop_total": len(body),
        "skipped": len([1 for addr, _, _ in ins if skip[0] < addr < skip[1]]),
        "kernel_total": len([1 for _, op, _ in ins if op != "NOP"]),
    }


ALU_OPS = {"LOP3", "SHF", "PRMT", "IADD3", "ISETP", "SEL", "LEA", "FSEL", "IABS", "IMNMX", "SGXT",
           "BMSK", "BREV", "FLO", "POPC", "PLOP3", "P2R", "R2P", "VIADD", "VIMNMX", "MOV", "LEA.HI"}
FMA_OPS = {"IMAD", "IDP", "IDP4A", "IMUL", "FFMA", "FMUL", "FADD", "HFMA2", "HADD2", "HMUL2", "FSETP",
           "FMNMX", "I2F", "F2I", "F2F"}
MEM_OPS = {"LDG", "LDS", "STS", "STG", "LDL", "STL", "LDC", "ULDC", "LDSM", "ATOMS", "RED", "ATOMG"}


def pipe_summary(mix: dict[str, int]) -> dict[str, int]:
    """Rough split of a loop's opcodes into ALU / FMA-pipe / memory / other."""
    out = {"alu": 0, "fma": 0, "mem": 0, "other": 0}
    for op, n in mix.items():
        if op in ALU_OPS:
            out["alu"] += n
        elif op in FMA_OPS:
            out["fma"] += n
        elif op in MEM_OPS:
            out["mem"] += n
        else:
            out["other"] += n
    return out
