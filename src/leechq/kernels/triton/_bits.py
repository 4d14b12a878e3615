"""Bit-level device helpers shared by the lattice kernels (byte permutes, magic-number floats).

``prmt`` is PTX's byte permute (``prmt.b32 d, a, b, sel``: output byte i is byte ``sel`` nibble i of
the 8-byte pair ``b:a``; selectors here never set a nibble's bit 3, so the sign-replicate mode is never
used, docs/kernels.md). Under the Triton interpreter (``USE_ASM = False``) it
is emulated with shifts and masks, so the interpreter tests run the same algorithm.

``byte_to_f32``: a biased byte ``b`` (value + 128) becomes an exact f32 via the bit pattern
``0x4B0000bb`` (= 2^23 + b) minus 2^23 + 128 — no int→float conversion instruction.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # grid dependency control (Triton ≥ 3.3); without it PDL_AVAILABLE is False and the
    # launchers never set PDL
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    PDL_AVAILABLE = True
except ImportError:  # pragma: no cover - older Triton
    PDL_AVAILABLE = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

MAGIC_F32 = 8388736.0
"""2^23 + 128: subtracting it from the float with bits 0x4B0000bb gives bb − 128 exactly."""


@triton.jit
def await_previous_grid(PDL: tl.constexpr):
    """Programmatic dependent launch (Hopper): with ``PDL`` the program waits here until the grid
    launched before it on the stream has finished and its writes are visible
    (``griddepcontrol.wait``), then lets the next grid's programs be scheduled
    (``griddepcontrol.launch_dependents``). Everything a kernel does before this call may only
    read memory no earlier grid writes (weights, tables) and write only shared memory; a kernel
    launched with ``launch_pdl=True`` must call it before anything else. Without ``PDL`` it is
    nothing."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prmt(a, b, sel, USE_ASM: tl.constexpr):
    """Byte permute of uint32 tensors (selector nibbles < 8; only the low 16 bits of ``sel``)."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, $3;",
            "=r,r,r,r",
            [a, b, sel],
            dtype=tl.uint32,
            is_pure=True,
            pack=1,
        )
    else:
        out = tl.zeros_like(a)
        for i in tl.static_range(4):
            k = (sel >> (4 * i)) & 7
            src = tl.where(k < 4, a, b)
            byte = (src >> ((k & 3) * 8)) & 0xFF
            out = out | (byte << (8 * i))
    return out


@triton.jit
def and_or(a, mask, c, USE_ASM: tl.constexpr):
    """``(a & mask) | c`` of uint32 tensors as one ``lop3`` on the GPU (the compiler otherwise
    turns a disjoint OR into an add it cannot merge with the mask)."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r", [a, mask, c], dtype=tl.uint32,
            is_pure=True, pack=1,
        )
    else:
        out = (a & mask) | c
    return out


@triton.jit
def byte_to_f32(q, I: tl.constexpr, USE_ASM: tl.constexpr):
    """Byte ``I`` of the uint32 tensor ``q`` (a value biased by +128) as an exact float32."""
    if USE_ASM:
        # a = the constant (bytes 0..3), b = q (bytes 4..7): byte I of q is selector 4 + I, the
        # zero bytes are selector 0 and 0x4B is selector 3; the selector is then an immediate.
        magic = tl.full(q.shape, 0x4B000000, tl.uint32)
        sel = tl.full(q.shape, 0x3004 + I, tl.uint32)
        bits = prmt(magic, q, sel, USE_ASM)
    else:
        bits = ((q >> (8 * I)) & 0xFF) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def half2(x, USE_ASM: tl.constexpr):
    """A float32 tensor rounded to float16 (nearest even) in both halves of one int32."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "cvt.rn.f16x2.f32 $0, $1, $1;", "=r,f", [x], dtype=tl.int32, is_pure=True, pack=1,
        )
    else:
        h = x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        out = h | (h << 16)
    return out


@triton.jit
def bytes_times_f16x2(q, I: tl.constexpr, c2, s2, USE_ASM: tl.constexpr):
    """Bytes ``I`` and ``I + 1`` of the uint32 tensor ``q`` plus an offset, times the float16
    scale in both halves of ``s2`` (:func:`half2`), as float16 and packed in one int32 (byte
    ``I`` in the low half): ``f16((q_i + 1024 + c) · s)``, one rounding of the exact product.
    ``c2``: the float16 ``c`` in both halves, an integer (|c| ≤ 2048: exact in float16, and so is
    the sum), e.g. :data:`MINUS_1152` for signed values biased by +128.

    On the GPU three instructions for two values: a byte permute puts each byte under the
    float16 exponent of 1024 (``0x64qq`` is ``1024 + q``), one ``add.f16x2`` of ``c`` leaves the
    exact value and one ``mul.rn.f16x2`` scales both."""
    if USE_ASM:
        # a = q (bytes 0..3), b = 0x64 bytes (4..7): bytes [q_I, 0x64, q_I+1, 0x64]; a constant
        # selector, so it becomes an immediate
        sel = tl.full(q.shape, 0x4040 + I + ((I + 1) << 8), tl.uint32)
        exp = tl.full(q.shape, 0x64646464, tl.uint32)
        out = tl.inline_asm_elementwise(
            "{ .reg .b32 t; prmt.b32 t, $1, $2, $3; add.rn.f16x2 t, t, $4; "
            "mul.rn.f16x2 $0, t, $5; }",
            "=r,r,r,r,r,r", [q, exp, sel, c2, s2], dtype=tl.int32, is_pure=True, pack=1,
        )
    else:
        s = (s2 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        c = (c2 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.int32) + 1024
        lo = (((q >> (8 * I)) & 0xFF).to(tl.int32) + c).to(tl.float16) * s
        hi = (((q >> (8 * (I + 1))) & 0xFF).to(tl.int32) + c).to(tl.float16) * s
        out = ((lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF)
               | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16))
    return out


MINUS_1152 = tl.constexpr(-461314944)
"""float16 −1152 in both halves of an int32 (``0xE480E480``): the :func:`bytes_times_f16x2`
offset of bytes biased by +128."""


@triton.jit
def spread4_bytes(c4, USE_ASM: tl.constexpr):
    """4-bit masks → byte masks: bit i of ``c4`` (< 16) becomes 0xFF in byte i.

    The multiply by 0x10204080 moves bit i to bit 8i + 7 (no two partial products collide); a byte
    permute in sign-replicate mode (selector nibbles 8 + i) then copies each byte's top bit into the
    whole byte.
    """
    t = c4 * 0x10204080
    if USE_ASM:
        sel = tl.full(t.shape, 0xBA98, tl.uint32)
        out = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, 0, $2;", "=r,r,r", [t, sel], dtype=tl.uint32, is_pure=True, pack=1
        )
    else:
        out = ((t >> 7) & 0x01010101) * 0xFF
    return out


@triton.jit
def dp4a_self(q, acc, USE_ASM: tl.constexpr):
    """``acc + Σ_i s_i²`` over the 4 signed bytes ``s_i = byte_i(q) − 128`` of a biased quad."""
    v = q ^ 0x80808080
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $1, $2;", "=r,r,r", [v, acc], dtype=tl.int32, is_pure=True,
            pack=1,
        )
    else:
        out = acc
        for i in tl.static_range(4):
            b = ((v >> (8 * i)) & 0xFF).to(tl.int32)
            b = tl.where(b >= 128, b - 256, b)
            out = out + b * b
    return out


@triton.jit
def dp4a(a, b, acc, B_SIGNED: tl.constexpr, USE_ASM: tl.constexpr, A_SIGNED: tl.constexpr = True):
    """``acc + Σ_i a_i·b_i`` over the 4 bytes of two uint32 tensors: ``a`` signed bytes (or
    unsigned with ``A_SIGNED = False``), ``b`` unsigned bytes (``B_SIGNED = False``) or signed
    bytes; 32-bit accumulator, wrapping (an int32 view of the exact sum whenever that fits)."""
    if USE_ASM:
        op: tl.constexpr = ("dp4a." + ("s32" if A_SIGNED else "u32") + "."
                            + ("s32" if B_SIGNED else "u32") + " $0, $1, $2, $3;")
        out = tl.inline_asm_elementwise(op, "=r,r,r,r", [a, b, acc], dtype=tl.int32,
                                        is_pure=True, pack=1)
    else:
        out = acc.to(tl.int32)
        for i in tl.static_range(4):
            ai = ((a >> (8 * i)) & 0xFF).to(tl.int32)
            if A_SIGNED:
                ai = tl.where(ai >= 128, ai - 256, ai)
            bi = ((b >> (8 * i)) & 0xFF).to(tl.int32)
            if B_SIGNED:
                bi = tl.where(bi >= 128, bi - 256, bi)
            out = out + ai * bi
    return out


# Shared-memory tables (docs/kernels.md: the decoder tables belong in on-chip memory,
# not in L1 gathers). Triton has no shared-memory API, so the kernels that use these helpers reserve
# the space with a never-taken gather (``reserve_smem``: Triton then sizes its dynamic shared memory
# for it), copy the table into the start of ``global_smem`` (Triton's extern shared array) once per
# program, and read it with ``ld.shared``. Nothing else in those kernels may use shared memory while
# the table is live (checked on the SASS: no Triton STS/LDS inside the hot loop). Under the
# interpreter (``USE_ASM = False``) the same lookups read the global table instead.


@triton.jit
def reserve_smem(tab_ptr, never, WORDS: tl.constexpr):
    """Make Triton allocate ``4·WORDS`` bytes of dynamic shared memory (``never`` must be False at
    run time; the branch only exists for the compiler's allocation)."""
    if never:
        e = tl.arange(0, WORDS)
        g = tl.gather(tl.load(tab_ptr + e), e, 0)
        tl.store(tab_ptr + e, g)


@triton.jit
def smem_base(anchor):
    """The shared-space address of ``global_smem`` (int32 scalar; ``anchor``: any int32 scalar)."""
    return tl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r,r", [anchor], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def smem_store32(addr, value, ok):
    """``*addr = value`` in shared memory where ``ok`` (``addr``: byte address from
    :func:`smem_base`)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred q; setp.ne.u32 q, $3, 0; @q st.shared.u32 [$1], $2; mov.u32 $0, 0; }",
        "=r,r,r,r", [addr, value, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )


@triton.jit
def global_store128(ptr, a, b, c, d, ok, USE_ASM: tl.constexpr):
    """``ptr[0..3] = a, b, c, d`` (int32 tensors; ``ptr`` 16-byte aligned) where ``ok``: one
    ``st.global.v4`` per element on the GPU (Triton would otherwise emit four 4-byte stores or move
    the data through shared memory); four masked stores under the interpreter."""
    if USE_ASM:
        tl.inline_asm_elementwise(
            "{ .reg .pred q; setp.ne.u32 q, $6, 0; "
            "@q st.global.v4.b32 [$1], {$2, $3, $4, $5}; mov.u32 $0, 0; }",
            "=r,l,r,r,r,r,r", [ptr, a, b, c, d, ok.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1,
        )
    else:
        tl.store(ptr, a, mask=ok)
        tl.store(ptr + 1, b, mask=ok)
        tl.store(ptr + 2, c, mask=ok)
        tl.store(ptr + 3, d, mask=ok)


@triton.jit
def smem_load32_at(tab_ptr, addr, USE_ASM: tl.constexpr):
    """The table word at shared-space byte address ``addr`` (GPU), or at word ``addr // 4`` of
    ``tab_ptr`` (interpreter, where the staged base is 0): uint32."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "ld.shared.u32 $0, [$1];", "=r,r", [addr], dtype=tl.uint32, is_pure=False, pack=1)
    else:
        out = tl.load(tab_ptr + (addr >> 2)).to(tl.uint32)
    return out


@triton.jit
def smem_load128_at(tab_ptr, addr, USE_ASM: tl.constexpr):
    """Four table words from shared-space byte address ``addr`` (16-byte aligned; interpreter:
    words ``addr // 4 …+3`` of ``tab_ptr``): 4 × uint32."""
    if USE_ASM:
        a, b, c, d = tl.inline_asm_elementwise(
            "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", [addr],
            dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32), is_pure=False, pack=1)
    else:
        w = addr >> 2
        a = tl.load(tab_ptr + w).to(tl.uint32)
        b = tl.load(tab_ptr + w + 1).to(tl.uint32)
        c = tl.load(tab_ptr + w + 2).to(tl.uint32)
        d = tl.load(tab_ptr + w + 3).to(tl.uint32)
    return a, b, c, d


@triton.jit
def table_load32(tab_ptr, base, word, USE_ASM: tl.constexpr):
    """Word ``word`` of the staged table (shared memory at ``base``; 0 under the interpreter,
    which reads ``tab_ptr``): uint32."""
    return smem_load32_at(tab_ptr, base + word * 4, USE_ASM)


@triton.jit
def table_load128(tab_ptr, base, word, USE_ASM: tl.constexpr):
    """Words ``word .. word+3`` (``word`` a multiple of 4) of the staged table: 4 × uint32."""
    return smem_load128_at(tab_ptr, base + word * 4, USE_ASM)


# Warp-level helpers of the int8 tensor-core kernel (:mod:`.tetra48_imma`). They act on 1-D tensors
# of ``NW·32`` elements, element ``e`` in lane ``e mod 32`` of warp ``e // 32`` (the default layout
# of such a tensor with ``num_warps = NW``); on the GPU each is one PTX instruction per thread, so
# the tensors that reach them must keep that layout (the loads feeding them are inline PTX too,
# which Triton's coalescing pass leaves alone). Under the interpreter they are emulated with
# reshapes over the same lanes.


@triton.jit
def mma_i8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, A_SIGNED: tl.constexpr, NW: tl.constexpr,
           USE_ASM: tl.constexpr):
    """``D = A·B + C`` of ``mma.sync.m16n8k32`` with int8 ``A`` (signed bytes when ``A_SIGNED``,
    else unsigned), signed int8 ``B`` and int32 ``C``/``D``, in PTX's fragment layout: lane
    ``4g + c`` holds ``a0 = A[g, 4c..4c+3]``, ``a1 = A[g+8, 4c..]``, ``a2 = A[g, 16+4c..]``,
    ``a3 = A[g+8, 16+4c..]``, ``b0 = B[4c.., g]``, ``b1 = B[16+4c.., g]`` and
    ``c0, c1 = C[g, 2c], C[g, 2c+1]``, ``c2, c3 = C[g+8, 2c], C[g+8, 2c+1]`` (uint32 / int32)."""
    if USE_ASM:
        d0, d1, d2, d3 = tl.inline_asm_elementwise(
            ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 " if A_SIGNED else
             "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 ")
            + "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
            "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r", [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1,
        )
    else:
        d0, d1 = _mma_rows(a0, a2, b0, b1, c0, c1, A_SIGNED, NW)
        d2, d3 = _mma_rows(a1, a3, b0, b1, c2, c3, A_SIGNED, NW)
    return d0, d1, d2, d3


@triton.jit
def _mma_rows(alo, ahi, b0, b1, c_even, c_odd, A_SIGNED: tl.constexpr, NW: tl.constexpr):
    """Emulation of eight rows of :func:`mma_i8`: ``A`` rows ``g`` from ``alo`` (k < 16) and ``ahi``
    (k ≥ 16) of the lanes ``4g + c``; returns ``C[g, 2c] + D``, ``C[g, 2c+1] + D`` per lane."""
    shape: tl.constexpr = (NW, 8, 8, 4)  # (warp, A row g, B column n, k quad c)
    a_lo = tl.broadcast_to(tl.reshape(alo.to(tl.uint32, bitcast=True), (NW, 8, 1, 4)), shape)
    a_hi = tl.broadcast_to(tl.reshape(ahi.to(tl.uint32, bitcast=True), (NW, 8, 1, 4)), shape)
    w_lo = tl.broadcast_to(tl.reshape(b0.to(tl.uint32, bitcast=True), (NW, 1, 8, 4)), shape)
    w_hi = tl.broadcast_to(tl.reshape(b1.to(tl.uint32, bitcast=True), (NW, 1, 8, 4)), shape)
    zero = tl.zeros(shape, tl.int32)
    prod = dp4a(w_lo, a_lo, zero, A_SIGNED, False) + dp4a(w_hi, a_hi, zero, A_SIGNED, False)
    d = tl.reshape(tl.sum(prod, axis=3), (NW, 8, 4, 2))  # [warp, g, c, column parity]
    d_even, d_odd = tl.split(d)
    return (c_even + tl.reshape(d_even, (NW * 32,)).to(tl.int32),
            c_odd + tl.reshape(d_odd, (NW * 32,)).to(tl.int32))


@triton.jit
def shfl_idx(v, src, NW: tl.constexpr, USE_ASM: tl.constexpr):
    """Per lane, ``v`` (32-bit) of lane ``src`` (int32, 0..31) of the same warp."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "shfl.sync.idx.b32 $0, $1, $2, 0x1f, 0xffffffff;", "=r,r,r",
            [v.to(tl.int32, bitcast=True), src.to(tl.int32)], dtype=tl.int32, is_pure=True,
            pack=1,
        ).to(v.dtype, bitcast=True)
    else:
        out = tl.reshape(tl.gather(tl.reshape(v, (NW, 32)), tl.reshape(src, (NW, 32)), 1),
                         (NW * 32,))
    return out


@triton.jit
def global_load32(ptr, ok, USE_ASM: tl.constexpr):
    """``*ptr`` (a 32-bit word) where ``ok``, else 0: int32 (one ``ld.global.nc`` per element)."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "{ .reg .pred q; setp.ne.u32 q, $2, 0; mov.u32 $0, 0; "
            "@q ld.global.nc.u32 $0, [$1]; }",
            "=r,l,r", [ptr, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
        )
    else:
        out = tl.load(ptr, mask=ok, other=0).to(tl.int32, bitcast=True)
    return out


@triton.jit
def global_load128(ptr, ok, USE_ASM: tl.constexpr):
    """``ptr[0..3]`` (``ptr`` 16-byte aligned) where ``ok``, else zeros: 4 × int32 (one
    ``ld.global.nc.v4`` per element)."""
    if USE_ASM:
        a, b, c, d = tl.inline_asm_elementwise(
            "{ .reg .pred q; setp.ne.u32 q, $5, 0; mov.u32 $0, 0; mov.u32 $1, 0; "
            "mov.u32 $2, 0; mov.u32 $3, 0; @q ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4]; }",
            "=r,=r,=r,=r,l,r", [ptr, ok.to(tl.int32)],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1,
        )
    else:
        a = tl.load(ptr, mask=ok, other=0).to(tl.int32, bitcast=True)
        b = tl.load(ptr + 1, mask=ok, other=0).to(tl.int32, bitcast=True)
        c = tl.load(ptr + 2, mask=ok, other=0).to(tl.int32, bitcast=True)
        d = tl.load(ptr + 3, mask=ok, other=0).to(tl.int32, bitcast=True)
    return a, b, c, d


@triton.jit
def shfl_xor(v, mask: tl.constexpr, NW: tl.constexpr, USE_ASM: tl.constexpr):
    """Per lane, ``v`` (32-bit) of lane ``lane ^ mask`` of the same warp."""
    lane = tl.arange(0, NW * 32) % 32
    return shfl_idx(v, lane ^ mask, NW, USE_ASM)


@triton.jit
def global_load128_all(ptr, USE_ASM: tl.constexpr):
    """``ptr[0..3]`` (``ptr`` 16-byte aligned, always valid): 4 × int32, one ``ld.global.nc.v4``
    per element with no predicate (:func:`global_load128` without the zeroing moves)."""
    if USE_ASM:
        a, b, c, d = tl.inline_asm_elementwise(
            "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", [ptr],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1,
        )
    else:
        a = tl.load(ptr).to(tl.int32, bitcast=True)
        b = tl.load(ptr + 1).to(tl.int32, bitcast=True)
        c = tl.load(ptr + 2).to(tl.int32, bitcast=True)
        d = tl.load(ptr + 3).to(tl.int32, bitcast=True)
    return a, b, c, d


@triton.jit
def global_load64f_all(ptr, USE_ASM: tl.constexpr):
    """``ptr[0], ptr[1]`` (float32, ``ptr`` 8-byte aligned, always valid): one
    ``ld.global.nc.v2`` per element."""
    if USE_ASM:
        a, b = tl.inline_asm_elementwise(
            "ld.global.nc.v2.f32 {$0, $1}, [$2];", "=r,=r,l", [ptr],
            dtype=(tl.float32, tl.float32), is_pure=False, pack=1,
        )
    else:
        a = tl.load(ptr)
        b = tl.load(ptr + 1)
    return a, b


@triton.jit
def global_store32(ptr, value, ok, USE_ASM: tl.constexpr):
    """``*ptr = value`` (32-bit) where ``ok``: one ``st.global`` per element (no layout change
    for the store, so no conversion through shared memory)."""
    if USE_ASM:
        tl.inline_asm_elementwise(
            "{ .reg .pred q; setp.ne.u32 q, $3, 0; @q st.global.b32 [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r,r", [ptr, value.to(tl.int32, bitcast=True), ok.to(tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1,
        )
    else:
        tl.store(ptr, value, mask=ok)


@triton.jit
def warp_any(pred, NW: tl.constexpr, USE_ASM: tl.constexpr):
    """Per lane, 1 (int32) where any lane of its warp has ``pred`` (``vote.sync.any``), else 0."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; vote.sync.any.pred q, p, 0xffffffff; "
            "selp.u32 $0, 1, 0, q; }",
            "=r,r", [pred.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
        )
    else:
        m = tl.max(tl.reshape(pred.to(tl.int32), (NW, 32)), axis=1)
        out = tl.reshape(tl.broadcast_to(m[:, None], (NW, 32)), (NW * 32,))
    return out


@triton.jit
def fence_gpu(anchor, USE_ASM: tl.constexpr):
    """``fence.acq_rel.gpu`` on every lane (``anchor``: any int32 tensor; returns zeros of its
    shape); nothing under the interpreter, which runs programs one after another."""
    if USE_ASM:
        out = tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [anchor],
                                        dtype=tl.int32, is_pure=False, pack=1)
    else:
        out = anchor * 0
    return out


@triton.jit
def prefetch_l2(ptr, nbytes, ok, USE_ASM: tl.constexpr):
    """Ask the copy engine to bring ``[ptr, ptr + nbytes)`` into L2 (``ptr``: any global pointer;
    ``nbytes``: int32; ``ok``: per-element predicate): one ``cp.async.bulk.prefetch.L2`` (sm_90) per
    element of the 16-byte aligned range inside it — the start rounded down and the end rounded
    down, so the range never passes the last byte asked for (nor the start of an allocation,
    which is 16-byte aligned). A hint only: nothing is written, no register waits on it, and the
    bytes past the last aligned 16 stay for the demand loads. Without ``USE_ASM`` (the
    interpreter) it does nothing; returns a dummy int32 zero."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b64 a, b; .reg .b32 n;\n"
            "cvt.s64.s32 b, $2;\nadd.s64 b, $1, b;\nand.b64 b, b, -16;\n"
            "and.b64 a, $1, -16;\nsub.s64 b, b, a;\ncvt.u32.u64 n, b;\n"
            "setp.gt.s64 p, b, 0;\nsetp.ne.and.s32 p, $3, 0, p;\n"
            "@p cp.async.bulk.prefetch.L2.global [a], n;\nmov.u32 $0, 0; }",
            "=r,l,r,r", [ptr, nbytes, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
        )
    else:
        out = nbytes * 0
    return out


@triton.jit
def xor_and(a, b, mask, USE_ASM: tl.constexpr):
    """``(a ^ b) & mask`` of uint32 tensors as one ``lop3`` (LUT ``0x28``) on the GPU: where
    ``a ^ b`` has several masked uses the compiler keeps the XOR as its own instruction."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "lop3.b32 $0, $1, $2, $3, 0x28;", "=r,r,r,r", [a, b, mask], dtype=tl.uint32,
            is_pure=True, pack=1,
        )
    else:
        out = (a ^ b) & mask
    return out
