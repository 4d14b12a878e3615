"""Activation-side kernels: the input rotation ``Q x`` and the *prepared* activation layout.

Rotation (docs/kernels.md, forward semantics):
``Q = (Q_odd ⊗ H_m)·D`` with ``n = k·m``. Because ``(Q_odd ⊗ H_m)·v`` has group ``g`` equal to
``H_m · Σ_t Q_odd[g][t] · v_t``, the groups are mixed *first* (k multiply-adds per coordinate on the
sign-flipped input) and then transformed: one program per (activation row, group), each loading the
whole row once, mixing, and running one Walsh–Hadamard transform ``H_m`` (Sylvester order, scaled by
``1/√m``, f32 of the f64 reciprocal, passed in). ``M·k`` programs instead of one long program per
row (a single-CTA design is a CUDA shared-memory choice). :func:`rotate_kernel`
writes natural order (coalesced); :func:`rotate_prepared_kernel` writes the prepared layout below
in the same launch, each group program gathering its slots from the transformed group in
registers (``tl.gather``) and storing them coalesced along pairs. H200, µs per launch at 4096 /
12288 (``benchmarks/bench_rotation.py``): one launch 3.40 / 3.91; natural order +
:func:`prepare_kernel` 4.0 / 5.0; an earlier form that scattered one 4-byte store per coordinate
(``NPP`` words apart) 13–17.

The transform has two forms: butterflies (the default) and, with ``TC``, for groups of
``256 ≤ m ≤ 4096`` (:data:`TC_MIN`, :data:`TC_MAX`), two tensor-core products. On the H200 the
butterflies were faster for 4 of the 6 Qwen3 widths (natural order, µs per launch, butterflies vs
tensor cores: 4096: 3.1 vs 4.8; 12288: 3.9 vs 5.3; 2560: 2.7 vs 3.1; 5120: 3.2 vs 3.6; 9728: 4.8
vs 4.5; 17408: 5.4 vs 4.6), so the tensor-core form is opt-in
(``ops_rotate.rotate(tensor_cores=True)``).
Tensor-core form: with ``m = R·C`` (R = C = 64 for 4096, 32×64 for 2048, 32×32 for 1024, 16×32 for 512,
16×16 for 256) the mixed vector is held as the row-major R×C tile ``V`` (``z[C·a + b] = V[a, b]``),
and since ``H_m = H_R ⊗ H_C`` in Sylvester order, ``H_m z`` is ``H_R · V · H_C`` read back in the
same order (``H`` symmetric, ``H[i, j] = (−1)^popcount(i & j)`` generated in the kernel, no table).
Each product is made exact, so the result does not depend on how the tensor cores round or order
their accumulation: the tile is scaled by a power of two so ``|V'| < 2**11`` (from the exponent of
``max |V|``), then split three ways, ``V' ≈ hi + mid·2**-11 + lo·2**-22`` with integer parts
(``hi = rint(V')``, ``mid = rint((V' − hi)·2**11)``, ``lo = rint(((V' − hi)·2**11 − mid)·2**11)``;
every subtraction exact; the only loss, ``≤ 2**-23`` in ``V'`` (``2**-34`` of the power-of-two
scale), falls on coordinates below ``2**-10`` of that scale). The parts are integers of magnitude
≤ 2048, exact in float16, so each of the three ``float16 × (±1)`` products sums integers below
``2**17``: exact in the f32 accumulator, in any order and any rounding mode. The three products
are scaled and added in f32 (each scaled before the first addition: Triton would otherwise fold
``dot + c`` into the dot's accumulator, which is not exact), and the same is done for ``· H_C``
(``|H_R V'| / R < 2**11`` again). Smaller groups (tiny models) and larger ones keep butterflies
(``(a, b) → (a+b, a−b)``; each stage pairs the lowest index bit and then rotates the index bits, so
``log2 m`` stages visit every bit).

Prepared layout (what the lattice matvec kernels read): for a row of ``n_blocks`` blocks, pairs
are padded to ``NPP = 64·ceil(ceil(n_blocks/2) / 64)``; coordinate ``t`` of block ``b`` (parity
``b & 1``, pair ``b >> 1``) sits at ``((b & 1)·24 + t)·NPP + (b >> 1)`` and tail column ``i`` at
``48·NPP + i``; width ``48·NPP + 32``; every other slot holds 0, and the buffer has ``MP`` rows (the
next power of two ≥ M; rows past M are 0). ``t`` is the trio position for Tetra (value
``x[24 b + order[t]]``) and the natural position for Planes14. Lanes owning consecutive pairs then
read consecutive addresses, and the matvec kernels read it without masks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import await_previous_grid
from leechq.kernels.triton.tetra48_imma import store_activation_tile

TC_MIN = tl.constexpr(256)
"""Smallest group size whose transform can run on tensor cores (a power of two ≥ 256: the R×C tile,
``R = 2**floor(log2(m)/2)``, needs R, C ≥ 16 for float16 dots)."""
TC_MAX = tl.constexpr(4096)
"""Largest group size on tensor cores: a 64×128 tile (m = 8192) spills registers at 8 warps and
m = 32768 needs more shared memory than an H200 block has, so larger groups keep the butterflies."""


@triton.jit
def prepare_kernel(x_ptr, stride_xm, out_ptr, stride_om, order_ptr, M, n, n_blocks, NPP,
                   BLOCK: tl.constexpr):
    """Fill one row of the prepared layout (every slot, zeros included) from ``x`` (natural order,
    any float dtype); rows ``m ≥ M`` are zero."""
    m = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    width = 48 * NPP + 32
    in_row = pos < width
    body = pos < 48 * NPP
    npp1 = tl.maximum(NPP, 1)  # a tail-only row has NPP = 0: no body slot, no division by zero
    pt = pos // npp1
    par = pt // 24
    t = pt - par * 24
    blk = 2 * (pos - pt * NPP) + par
    nat = tl.load(order_ptr + t, mask=body, other=0)
    src_blk = blk * 24 + nat
    k = pos - 48 * NPP
    src = tl.where(body, src_blk, n_blocks * 24 + k)
    valid = (body & (blk < n_blocks)) | ((pos >= 48 * NPP) & (k < n - n_blocks * 24))
    valid = valid & ((pos * 0 + m) < M)
    v = tl.load(x_ptr + m * stride_xm + src, mask=valid & in_row, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + pos, v, mask=in_row)


@triton.jit
def _wht(v, MW: tl.constexpr, LOG2M: tl.constexpr):
    """Unnormalized Walsh–Hadamard transform of a 1-D tensor of size MW = 2**LOG2M (butterflies)."""
    for _ in tl.static_range(LOG2M):
        a, b = tl.split(tl.reshape(v, (MW // 2, 2)))
        v = tl.reshape(tl.join(a + b, a - b), (MW // 2, 2))
        v = tl.reshape(tl.trans(v), (MW,))
    return v


@triton.jit
def _hadamard(N: tl.constexpr):
    """The N×N Sylvester Hadamard matrix as float16: ``H[i, j] = (−1)^popcount(i & j)`` (the parity
    of ``i & j`` folded by shifts; N ≤ 2**16)."""
    p = tl.arange(0, N)[:, None] & tl.arange(0, N)[None, :]
    if N > 256:
        p ^= p >> 8
    p ^= p >> 4
    p ^= p >> 2
    p ^= p >> 1
    return (1 - 2 * (p & 1)).to(tl.float16)


@triton.jit
def _pow2(p):
    """``2**p`` as float32 for an int32 ``p`` in [−126, 127] (built from the exponent bits)."""
    return ((p + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _rint(x):
    """``x`` rounded to the nearest integer (ties to even), for ``|x| < 2**22``: adding 1.5·2**23
    in f32 drops the fraction, subtracting it back is exact."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _split3(v):
    """Integer-valued float16 parts of ``v`` (f32, ``|v| ≤ 2048``): ``hi + mid·2**-11 + lo·2**-22``
    equals ``v`` to within ``2**-23``; every part is an integer of magnitude ≤ 2048 (exact in
    float16). Each subtraction is exact (Sterbenz), each scaling a power of two."""
    hi = _rint(v)
    r = (v - hi) * 2048.0
    mid = _rint(r)
    lo = _rint((r - mid) * 2048.0)
    return hi.to(tl.float16), mid.to(tl.float16), lo.to(tl.float16)


@triton.jit
def _join3(hi, mid, lo, scale):
    """``(hi + mid·2**-11 + lo·2**-22)·scale`` from the three exact partial products. Every
    product is scaled *before* any addition: Triton rewrites ``dot(a, b) + c`` into
    ``dot(a, b, acc=c)``, which would accumulate inexactly inside the tensor cores; ``scale`` must
    not be the literal 1."""
    return (hi * scale + mid * (scale * (1.0 / 2048.0))) + lo * (scale * (1.0 / 4194304.0))


@triton.jit
def _h_left(h, v, scale):
    """``h · v · scale`` for a ±1 float16 matrix ``h`` and an f32 tile ``v`` with ``|v| ≤ 2048``:
    three float16 tensor-core products of the parts of :func:`_split3`, each exact (integers
    below 2**24 whatever the accumulation order or rounding)."""
    hi, mid, lo = _split3(v)
    return _join3(tl.dot(h, hi), tl.dot(h, mid), tl.dot(h, lo), scale)


@triton.jit
def _h_right(v, h, scale):
    """``v · h · scale``, the mirror of :func:`_h_left`."""
    hi, mid, lo = _split3(v)
    return _join3(tl.dot(hi, h), tl.dot(mid, h), tl.dot(lo, h), scale)


@triton.jit
def _wht_tc(v, inv_sqrt_m, R: tl.constexpr, C: tl.constexpr):
    """``H_m z · inv_sqrt_m`` for ``z`` held as the row-major R×C tile ``v`` (``z[C·a + b] =
    v[a, b]``, m = R·C, R, C ≥ 16): ``H_R · v · H_C`` on tensor cores; see the module docstring."""
    # 2**(e − 126) is a power of two above max |v|; 2**(137 − e) scales v into |v'| < 2**11
    e = tl.maximum((tl.max(tl.abs(v)).to(tl.int32, bitcast=True) >> 23) & 0xFF, 11)
    y = _h_left(_hadamard(R), v * _pow2(137 - e), 1.0 / R)   # |y| < 2**11 again
    return _h_right(y, _hadamard(C), inv_sqrt_m * R * _pow2(e - 137))


PRE_NONE = tl.constexpr(0)
"""``PRE``: the rotation reads ``x`` as it is."""
PRE_NORM = tl.constexpr(1)
"""``PRE``: the rotation reads ``rms_norm(x)`` (HF rounding: normalise in f32, narrow to x's dtype,
multiply by the weight in the promoted dtype ``HDT``)."""
PRE_ADD_NORM = tl.constexpr(2)
"""``PRE``: the rotation reads ``rms_norm(x + aux)`` (``aux`` narrowed to x's dtype first) and the
programs store the residual ``x + aux`` (each its own group's columns)."""
PRE_SILU_MUL = tl.constexpr(3)
"""``PRE``: ``x`` is a gate|up row of width 2·N; the rotation reads ``silu(gate)·up`` computed in
x's dtype and narrowed to ``HDT``."""


@triton.jit
def _round(v, dt: tl.constexpr):
    """``v`` (f32) rounded to nearest even in ``dt`` (float16, bfloat16 or float32), as ``dt``.
    The bfloat16 rounding is done on the bits (finite inputs): the interpreter's f32 → bfloat16
    conversion truncates, and its explicit round-to-nearest is inexact."""
    if dt == tl.bfloat16:
        b = v.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        r = b.to(tl.float32, bitcast=True).to(tl.bfloat16)  # exact: already a bfloat16 value
    else:
        r = v.to(dt)
    return r


@triton.jit
def _narrow(v, HDT: tl.constexpr):
    """``v`` (f32) rounded to the dtype coded by ``HDT`` (0 float32, 1 float16, 2 bfloat16) and
    widened back."""
    if HDT == 1:
        v = _round(v, tl.float16).to(tl.float32)
    elif HDT == 2:
        v = _round(v, tl.bfloat16).to(tl.float32)
    return v


@triton.jit
def _residual(xrow, auxrow, cols, PRE: tl.constexpr):
    """``x`` (or ``x + aux`` narrowed to x's dtype, for :data:`PRE_ADD_NORM`) at ``cols``, in x's
    dtype. The sum is taken in f32 and rounded once, as torch adds half tensors (and the
    interpreter has no bfloat16 arithmetic)."""
    v = tl.load(xrow + cols)
    if PRE == PRE_ADD_NORM:
        dt = v.dtype
        a = _round(tl.load(auxrow + cols).to(tl.float32), dt).to(tl.float32)
        v = _round(v.to(tl.float32) + a, dt)
    return v


@triton.jit
def _norm_scale(xrow, auxrow, eps, K: tl.constexpr, MW: tl.constexpr, PRE: tl.constexpr):
    """``rsqrt(mean(r²) + eps)`` of the row's residual ``r`` (f32, for the norm pre-ops; 1.0
    otherwise)."""
    rs = 1.0
    if PRE == PRE_NORM or PRE == PRE_ADD_NORM:  # noqa: SIM109 (the jit compares constexprs)
        acc = tl.zeros([MW], tl.float32)
        for t in range(K):
            r = _residual(xrow, auxrow, t * MW + tl.arange(0, MW), PRE).to(tl.float32)
            acc += r * r
        rs = tl.math.rsqrt(tl.sum(acc, 0) / (K * MW) + eps)
    return rs


@triton.jit
def _load_h(xrow, auxrow, w_ptr, rs, cols, PRE: tl.constexpr, HDT: tl.constexpr,
            N: tl.constexpr):
    """The rotation's input at ``cols`` (any shape) as float32: ``x`` itself or its pre-op (see
    :data:`PRE_NORM`, :data:`PRE_ADD_NORM`, :data:`PRE_SILU_MUL`)."""
    if PRE == PRE_NONE:
        h = tl.load(xrow + cols).to(tl.float32)
    elif PRE == PRE_SILU_MUL:
        gate = tl.load(xrow + cols)
        dt = gate.dtype
        gf = gate.to(tl.float32)
        silu = _round(gf / (1.0 + tl.exp(-gf)), dt).to(tl.float32)
        up = tl.load(xrow + N + cols).to(tl.float32)
        h = _narrow(_round(silu * up, dt).to(tl.float32), HDT)
    else:
        r = _residual(xrow, auxrow, cols, PRE)
        n = _round(r.to(tl.float32) * rs, r.dtype).to(tl.float32)
        h = _narrow(n * tl.load(w_ptr + cols).to(tl.float32), HDT)
    return h


@triton.jit
def _mix(xrow, auxrow, w_ptr, rs, signs_ptr, small_ptr, g, j, K: tl.constexpr,
         MW: tl.constexpr, PRE: tl.constexpr, HDT: tl.constexpr):
    """Group ``g`` of ``(Q_odd ⊗ I_m)·D h`` at offsets ``j`` (any shape) within the group (f32),
    ``h`` the rotation's input (:func:`_load_h`)."""
    if K == 1:
        z = _load_h(xrow, auxrow, w_ptr, rs, j, PRE, HDT, MW) * tl.load(signs_ptr + j)
    else:
        z = tl.zeros(j.shape, tl.float32)
        for t in range(K):
            coef = tl.load(small_ptr + g * K + t)
            xt = _load_h(xrow, auxrow, w_ptr, rs, t * MW + j, PRE, HDT, K * MW)
            z += coef * (xt * tl.load(signs_ptr + t * MW + j))
    return z


@triton.jit
def _group_transform(xrow, auxrow, w_ptr, eps, signs_ptr, small_ptr, g, inv_sqrt_m,
                     K: tl.constexpr, MW: tl.constexpr, LOG2M: tl.constexpr, TC: tl.constexpr,
                     PRE: tl.constexpr, HDT: tl.constexpr):
    """Group ``g`` of ``Q h`` for one row as a 1-D float32 tensor [MW] in natural order (``h``:
    the row or its pre-op, ``PRE``): with ``TC``, tensor cores for ``TC_MIN ≤ MW ≤ TC_MAX``;
    otherwise (and always outside that range) butterflies."""
    rs = _norm_scale(xrow, auxrow, eps, K, MW, PRE)
    if TC and MW >= TC_MIN and MW <= TC_MAX:
        R: tl.constexpr = 1 << (LOG2M // 2)
        C: tl.constexpr = MW // R
        j = C * tl.arange(0, R)[:, None] + tl.arange(0, C)[None, :]
        v = tl.reshape(_wht_tc(_mix(xrow, auxrow, w_ptr, rs, signs_ptr, small_ptr, g, j, K, MW,
                                    PRE, HDT), inv_sqrt_m, R, C), (MW,))
    else:
        j = tl.arange(0, MW)
        v = _wht(_mix(xrow, auxrow, w_ptr, rs, signs_ptr, small_ptr, g, j, K, MW, PRE, HDT), MW,
                 LOG2M) * inv_sqrt_m
    return v


@triton.jit
def _store_residual(xrow, auxrow, res_ptr, row, stride_rm, g, live, MW: tl.constexpr,
                    PRE: tl.constexpr, part, SPLITS: tl.constexpr):
    """For :data:`PRE_ADD_NORM`: the residual ``x + aux`` of the group's columns (live rows);
    with ``SPLITS`` programs per group, program ``part`` stores its share of them."""
    if PRE == PRE_ADD_NORM:
        cols = g * MW + part * (MW // SPLITS) + tl.arange(0, MW // SPLITS)
        tl.store(res_ptr + row * stride_rm + cols, _residual(xrow, auxrow, cols, PRE),
                 mask=(cols * 0 + row) < live)


@triton.jit
def rotate_kernel(
    x_ptr, stride_xm, signs_ptr, small_ptr, out_ptr, stride_om, inv_sqrt_m,
    aux_ptr, stride_am, w_ptr, res_ptr, stride_rm, eps, dest_ptr,
    K: tl.constexpr, MW: tl.constexpr, LOG2M: tl.constexpr, TC: tl.constexpr,
    PRE: tl.constexpr = 0, HDT: tl.constexpr = 0, DEST: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Group ``program_id(1)`` of ``Q h`` for activation row ``program_id(0)``, natural order; see
    the module docstring. Grid ``(M, K)``. ``h`` is the row or its pre-op (``PRE``; ``aux``,
    ``w``, ``res``, ``eps`` unused without one). With ``TC``, tensor cores for ``TC_MIN ≤ MW ≤
    TC_MAX``; otherwise (and always outside that range) butterflies. With ``DEST`` coordinate
    ``c`` goes to column ``dest[c]`` instead (int32, a permutation: the column order of a
    dequantized float16 copy; an entry outside ``[0, n)`` is not written), rounded to the
    output's dtype. ``PDL``: waits for the previous grid first (launched with ``launch_pdl``)."""
    await_previous_grid(PDL)
    row = tl.program_id(0)
    g = tl.program_id(1)
    xrow = x_ptr + row * stride_xm
    auxrow = aux_ptr + row * stride_am
    v = _group_transform(xrow, auxrow, w_ptr, eps, signs_ptr, small_ptr, g, inv_sqrt_m, K, MW,
                         LOG2M, TC, PRE, HDT)
    cols = g * MW + tl.arange(0, MW)
    if DEST:  # a map entry outside the row writes nothing (memory safety; the caller's contract)
        cols = tl.load(dest_ptr + cols)
    tl.store(out_ptr + row * stride_om + cols, v.to(out_ptr.dtype.element_ty),
             mask=(cols >= 0) & (cols < K * MW))
    _store_residual(xrow, auxrow, res_ptr, row, stride_rm, g, row + 1, MW, PRE, 0, 1)


@triton.jit
def rotate_prepared_kernel(
    x_ptr, stride_xm, signs_ptr, small_ptr, out_ptr, stride_om, order_ptr, inv_sqrt_m, M,
    aux_ptr, stride_am, w_ptr, res_ptr, stride_rm, eps, rec_ptr, ex_ptr,
    N: tl.constexpr, N_BLOCKS: tl.constexpr, NPP: tl.constexpr, PR: tl.constexpr,
    K: tl.constexpr, MW: tl.constexpr, LOG2M: tl.constexpr, TC: tl.constexpr,
    PRE: tl.constexpr = 0, HDT: tl.constexpr = 0, SPLITS: tl.constexpr = 1,
    RECORDS: tl.constexpr = False, PDL: tl.constexpr = False, A16: tl.constexpr = False,
):
    """Group ``program_id(1)`` of ``Q x`` for prepared row ``program_id(0)``, written straight into
    the prepared layout (one launch instead of rotation + :func:`prepare_kernel`). Grid
    ``(MP, K, SPLITS)``; rows ``≥ M`` are written as zeros. With ``SPLITS`` > 1 each of the
    group's ``SPLITS`` programs transforms the whole group (redundantly: the transform is short)
    and writes ``1/SPLITS`` of its slots — the gather and the scattered stores, a third of a
    one-row launch's time, spread over more SMs.

    The group's columns ``[g·MW, (g+1)·MW)`` fall in the pairs ``p0 = ⌊g·MW/24⌋/2 …``; the program
    covers the ``[48, PR]`` slots of those pairs in the 48 (parity, trio position) planes (``PR`` a
    power of two ≥ ``⌈MW/48⌉ + 2`` plus the padding pairs, so the last group reaches ``NPP``), takes
    each slot's value from its transformed group in registers (``tl.gather``, no global round
    trip) and writes the slots it owns: those whose source column is in the group and, in the last
    group, the empty ones. Every slot of the row is written exactly once. ``h`` is the row or its
    pre-op (``PRE``, as :func:`rotate_kernel`; live rows store their residual).

    The slots' tile is gathered in limb-word order (row ``parity·32 + (section·2 + half)·4 + j``
    holds trio position ``8·section + 2j + half``), so that with one group (``K = 1``) the
    records below come from it without a second gather. With ``RECORDS`` the programs also write
    the int8 tensor-core kernel's activation records of their pairs (``rec``, ``ex``:
    :func:`.tetra48_imma.store_activation_tile`, the words ``ops.imma_activation`` would compute
    from this prepared row), so that kernel needs no launch of its own. ``A16``: the records of
    the activation rounded to 16 bits per block (:data:`.tetra48_m1.A16_STEP`). ``PDL`` as :func:`rotate_kernel`."""
    await_previous_grid(PDL)
    row = tl.program_id(0)
    g = tl.program_id(1)
    part = tl.program_id(2)
    live = row < M
    xrow = x_ptr + tl.minimum(row, M - 1) * stride_xm
    auxrow = aux_ptr + tl.minimum(row, M - 1) * stride_am
    v = _group_transform(xrow, auxrow, w_ptr, eps, signs_ptr, small_ptr, g, inv_sqrt_m, K, MW,
                         LOG2M, TC, PRE, HDT)
    _store_residual(xrow, auxrow, res_ptr, row, stride_rm, g, M, MW, PRE, part, SPLITS)
    lo = g * MW
    PRS: tl.constexpr = PR // SPLITS
    # tile row r = parity·32 + (section·2 + half)·4 + j holds trio position t = 8·section + 2j +
    # half (section 3: unused rows), i.e. plane parity·24 + t: the order of the limb words
    r = tl.arange(0, 64)[:, None]
    par = r // 32
    sec = (r // 8) % 4
    t = 8 * sec + 2 * (r % 4) + (r // 4) % 2
    pl = par * 24 + t
    nat = tl.load(order_ptr + tl.where(sec < 3, t, 0))
    pair = (lo // 24) // 2 + part * PRS + tl.arange(0, PRS)[None, :]
    blk = 2 * pair + par
    src = blk * 24 + nat
    slot = (sec < 3) & (pair < NPP)
    full = slot & (blk < N_BLOCKS)
    mine = full & (src >= lo) & (src < lo + MW)
    idx = tl.reshape(tl.where(mine, src - lo, 0), (64 * PRS,))
    val = tl.reshape(tl.gather(v, idx, 0), (64, PRS))
    val = tl.where(mine & live, val, 0.0)
    orow = out_ptr + row * stride_om
    # (the last-group test is a full tile: the interpreter's int1 scalar broadcast makes int32)
    empty_last = slot & (blk >= N_BLOCKS) & ((blk * 0 + g) == K - 1)
    tl.store(orow + pl * NPP + pair, val, mask=mine | empty_last)
    # tail column N_BLOCKS·24 + i at 48·NPP + i (i < 32): written by its group; the slots past
    # the row (zeros) by the last group; by the group's first program only
    i = tl.arange(0, 32)
    tsrc = N_BLOCKS * 24 + i
    tmine = (tsrc < N) & (tsrc >= lo) & (tsrc < lo + MW)
    tval = tl.gather(v, tl.where(tmine, tsrc - lo, 0), 0)
    first = (i * 0 + part) == 0
    tl.store(orow + 48 * NPP + i, tl.where(tmine & live, tval, 0.0),
             mask=(tmine | ((tsrc >= N) & ((i * 0 + g) == K - 1))) & first)
    if RECORDS:
        store_activation_tile(val, rec_ptr, ex_ptr, row, pair, NPP, A16)
