"""The packed E2M1 -> BF16 decode as inline PTX, one generator for the weight dequant (dequant.py) and the
FP4 KV cache (cache_quant.py).

A nibble's 3 magnitude bits moved to BF16 bits 6-8 and its sign to bit 15 read as value * 2^-126 exactly
(code 1 is the BF16 subnormal 2^-127); a packed multiply by scale * 2^126 gives value * scale, a normal
BF16 number (exact). The two shifts per nibble are one multiply: (n << 6) + (n << 12) (low) and
(n << 2) + (n << 8) (high) do not overlap, so no carry reaches a kept bit."""

from __future__ import annotations

_LOW, _HIGH = ("0x000F000F", 4160), ("0x00F000F0", 260)  # nibble mask, the multiply of its two shifts
_PRMT = ("0x4140", "0x4342")  # bytes (b0, b1), then (b2, b3), one per 16-bit half


def e2m1_bf16x2_asm(num_bytes: int, times_2pow126: bool) -> str:
    """PTX for `tl.inline_asm_elementwise` decoding `num_bytes` (2 or 4) packed FP4 bytes per instance.

    Operands: outputs first, as BF16x2 (low nibbles of bytes (b0, b1)[, (b2, b3)], then the high
    nibbles), then the packed bytes, then one BF16x2 factor per byte pair. With `times_2pow126` the
    factors are the plain scales and the decode multiplies by 2^126 (0x7E80) itself; without, they are
    scale * 2^126 already (dequant's `asm_scale_factor`: one multiply fewer)."""
    if num_bytes not in (2, 4):
        raise ValueError(f"e2m1_bf16x2_asm decodes 2 or 4 bytes per instance, got {num_bytes}")
    pairs = ["x"] if num_bytes == 2 else ["x01", "x23"]
    packed = 2 * len(pairs)  # operand index of the packed bytes, after the outputs
    c = ["c"] if times_2pow126 else []
    lines = ["{", f".reg .b32 {', '.join(['z', 'm0', *c, *pairs, 't'])};", "mov.b32 z, 0;",
             "mov.b32 m0, 0x80008000;"]
    if times_2pow126:
        lines.append("mov.b32 c, 0x7E807E80;")
    lines += [f"prmt.b32 {x}, ${packed}, z, {sel};" for x, sel in zip(pairs, _PRMT[:len(pairs)], strict=True)]
    for half, (mask, mul) in enumerate((_LOW, _HIGH)):
        for j, x in enumerate(pairs):
            lines += [f"and.b32 t, {x}, {mask};", f"mul.lo.u32 t, t, {mul};", "and.b32 t, t, 0x81C081C0;"]
            if times_2pow126:
                lines.append("fma.rn.bf16x2 t, t, c, m0;")
            lines.append(f"fma.rn.bf16x2 ${half * len(pairs) + j}, t, ${packed + 1 + j}, m0;")
    return "\n" + "\n".join([*lines, "}"]) + "\n"
