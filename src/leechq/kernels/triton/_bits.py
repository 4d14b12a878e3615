"""Bit-level device helpers shared by the lattice kernels (byte permutes, magic-number floats).

``prmt`` is PTX's byte permute (``prmt.b32 d, a, b, sel``: output byte i is byte ``sel`` nibble i of
the 8-byte pair ``b:a``; selectors here never set a nibble's bit 3, so the sign-replicate mode is never
used, layouts-kernels-recipe.md §6.3 item 4). Under the Triton interpreter (``USE_ASM = False``) it
is emulated with shifts and masks, so the interpreter tests run the same algorithm.

``byte_to_f32``: a biased byte ``b`` (value + 128) becomes an exact f32 via the bit pattern
``0x4B0000bb`` (= 2^23 + b) minus 2^23 + 128 — no int→float conversion instruction (§2.6).
"""

from __future__ import annotations

import triton
import triton.language as tl

MAGIC_F32 = 8388736.0
"""2^23 + 128: subtracting it from the float with bits 0x4B0000bb gives bb − 128 exactly."""


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
