"""Engram ops for all rows of a step, one launch each: n-gram hashing, FP8 table gather + dequantize, and
the per-stream gate.

The gather and the gate stay separate launches because the model's `wkv` projection sits between them
(keys and value are a linear of the gathered rows). All three are row-wise with tile configs chosen
from the widths only, so a row's result never depends on the other rows of the batch:
* `engram_hash`: int64 products, XOR and floor modulo as the reference: identical rows.
* `engram_lookup`: E4M3 and UE8M0 decoded in integer math, one float32 product rounded to the output
  dtype: identical values.
* `engram_gate`: the three H-long float32 sums run in chunks in a fixed order (not torch's), so the gate
  agrees with the reference to float32 rounding (~1e-6 relative); the sum with the value is rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels_cuda.cache_quant import e4m3_value, ue8m0_value

_HASH_ROWS = 64  # rows per hash program
_LOOKUP_ELEMS = 4096  # gathered elements per lookup program
_GATE_CHUNK = 1024  # hidden channels per gate loop step


# row counts are not specialised (== 1, multiple of 16): a new batch size compiles no new kernel
@triton.jit(do_not_specialize=["T"])
def _hash_kernel(
    ngram_ptr, mult_ptr, prime_ptr, offset_ptr, out_ptr, T, stride_t,
    N: tl.constexpr, HEADS: tl.constexpr, HEADS_P2: tl.constexpr, ROWS: tl.constexpr,
):
    t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    h = tl.arange(0, HEADS_P2)
    ok = t < T
    out_mask = ok[:, None] & (h < HEADS)[None, :]
    first = tl.load(ngram_ptr + t * stride_t, mask=ok, other=0).to(tl.int64)
    rolling = first * tl.load(mult_ptr).to(tl.int64)
    for s in tl.static_range(1, N):
        x = tl.load(ngram_ptr + t * stride_t + s, mask=ok, other=0).to(tl.int64)
        rolling = rolling ^ (x * tl.load(mult_ptr + s).to(tl.int64))
        prime = tl.load(prime_ptr + (s - 1) * HEADS + h, mask=h < HEADS, other=1).to(tl.int64)
        offset = tl.load(offset_ptr + (s - 1) * HEADS + h, mask=h < HEADS, other=0).to(tl.int64)
        rem = rolling[:, None] % prime[None, :]
        rem = tl.where(rem < 0, rem + prime[None, :], rem)  # floor modulo, as torch's %
        cols = (s - 1) * HEADS + h
        out_offs = t[:, None].to(tl.int64) * ((N - 1) * HEADS) + cols[None, :]
        tl.store(out_ptr + out_offs, rem + offset[None, :], mask=out_mask)


def engram_hash(
    ngrams: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Table rows [T, (N-1)*heads] long of n-gram ids [T, N]: the order-n hash p_0 ^ ... ^ p_{n-1} of
    p_s = x_s * mu_s (int64, wrapping), mod primes[n-2, head], plus offsets[n-2, head]."""
    t, n = ngrams.shape
    heads = primes.shape[-1]
    if multipliers.shape != (n,) or primes.shape != (n - 1, heads) or offsets.shape != primes.shape:
        raise ValueError(f"n-grams [T, {n}] need multipliers [{n}] and primes/offsets [{n - 1}, heads], got "
                         f"{tuple(multipliers.shape)}, {tuple(primes.shape)}, {tuple(offsets.shape)}")
    out = torch.empty(t, (n - 1) * heads, dtype=torch.int64, device=ngrams.device)
    if t and n > 1:
        ngrams = ngrams if ngrams.stride(1) == 1 else ngrams.contiguous()
        _hash_kernel[(triton.cdiv(t, _HASH_ROWS),)](
            ngrams, multipliers.contiguous(), primes.contiguous(), offsets.contiguous(), out, t,
            ngrams.stride(0), N=n, HEADS=heads, HEADS_P2=triton.next_power_of_2(heads), ROWS=_HASH_ROWS,
        )
    return out


@triton.jit(do_not_specialize=["R"])
def _lookup_kernel(
    table_ptr, scale_ptr, rows_ptr, out_ptr, R, D, stride_table, stride_scale,
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = r < R
    row = tl.load(rows_ptr + r, mask=ok, other=0).to(tl.int64)
    c = tl.arange(0, BLOCK_D)
    mask = ok[:, None] & (c < D)[None, :]
    q = tl.load(table_ptr + row[:, None] * stride_table + c[None, :], mask=mask, other=0).to(tl.int32)
    g = tl.arange(0, BLOCK_D // 32)
    g_mask = ok[:, None] & (g < D // 32)[None, :]
    s = tl.load(scale_ptr + row[:, None] * stride_scale + g[None, :], mask=g_mask, other=127).to(tl.int32)
    vals = tl.reshape(e4m3_value(q), (ROWS, BLOCK_D // 32, 32)) * ue8m0_value(s)[:, :, None]
    out = tl.reshape(vals, (ROWS, BLOCK_D)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + r[:, None].to(tl.int64) * D + c[None, :], out, mask=mask)


def engram_lookup(
    table: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Gather FP8 rows [T, heads] of a [N, D] table with UE8M0 [N, D/32] scales -> [T, heads * D] in
    dtype (float32 products of element and scale, rounded once)."""
    if table.dim() != 2 or table.shape[1] % 32 or scale.shape != (table.shape[0], table.shape[1] // 32):
        raise ValueError(f"table must be [N, D] (D a multiple of 32) with scales [N, D/32], got "
                         f"{tuple(table.shape)} and {tuple(scale.shape)}")
    d = table.shape[1]
    flat = rows.reshape(-1).contiguous()
    out = torch.empty(flat.shape[0], d, dtype=dtype, device=table.device)
    if flat.shape[0]:
        table_bytes = table.view(torch.uint8)
        scale_bytes = scale.view(torch.uint8)
        block_d = triton.next_power_of_2(d)
        per_program = max(1, _LOOKUP_ELEMS // block_d)
        _lookup_kernel[(triton.cdiv(flat.shape[0], per_program),)](
            table_bytes, scale_bytes, flat, out, flat.shape[0], d, table_bytes.stride(0),
            scale_bytes.stride(0), ROWS=per_program, BLOCK_D=block_d,
        )
    return out.reshape(*rows.shape[:-1], -1)


@triton.jit
def _gate_kernel(
    stream_ptr, key_ptr, value_ptr, weight_ptr, mask_ptr, out_ptr, M, H, eps, inv_sqrt_h, stride_key,
    stride_value, HAS_MASK: tl.constexpr, CHUNK: tl.constexpr,
):
    """Program (t, i): stream i of row t. Two passes over H: the three sums, then the update."""
    t, i = tl.program_id(0).to(tl.int64), tl.program_id(1)
    base = (t * M + i) * H
    key_base = t * stride_key + i * H
    hh = tl.zeros((CHUNK,), tl.float32)
    kk = tl.zeros((CHUNK,), tl.float32)
    hwk = tl.zeros((CHUNK,), tl.float32)
    for c0 in range(0, H, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        m = c < H
        h = tl.load(stream_ptr + base + c, mask=m, other=0.0).to(tl.float32)
        k = tl.load(key_ptr + key_base + c, mask=m, other=0.0).to(tl.float32)
        w = tl.load(weight_ptr + i * H + c, mask=m, other=0.0)
        hh += h * h
        kk += k * k
        hwk += h * w * k
    n = H.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(hh, axis=0) / n + eps) * tl.math.rsqrt(tl.sum(kk, axis=0) / n + eps)
    dot = tl.sum(hwk, axis=0) * rstd * inv_sqrt_h
    root = tl.sqrt(tl.maximum(tl.abs(dot), 1e-6))
    gate = tl.sigmoid(tl.where(dot < 0, -root, root))
    if HAS_MASK:
        gate = tl.where(tl.load(mask_ptr + t) != 0, gate, 0.0)
    for c0 in range(0, H, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        m = c < H
        h = tl.load(stream_ptr + base + c, mask=m, other=0.0).to(tl.float32)
        v = tl.load(value_ptr + t * stride_value + c, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + base + c, (h + gate * v).to(out_ptr.dtype.element_ty), mask=m)


def engram_gate(
    streams: torch.Tensor,
    keys: torch.Tensor,
    value: torch.Tensor,
    weights: torch.Tensor,
    token_mask: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """R_i += g_i * v with g_i = sigmoid(signed sqrt of a normalised <R_i, w_i * k_i> / sqrt(H)).

    streams [T, m, H], keys [T, m, H], value [T, H], weights [m, H]; token_mask [T] False -> gate 0.
    """
    t, m, h = streams.shape
    if keys.shape != streams.shape or value.shape != (t, h) or weights.shape != (m, h):
        raise ValueError(f"streams {tuple(streams.shape)} need keys of the same shape, value [{t}, {h}] and "
                         f"weights [{m}, {h}], got {tuple(keys.shape)}, {tuple(value.shape)}, "
                         f"{tuple(weights.shape)}")
    out = torch.empty_like(streams, memory_format=torch.contiguous_format)
    if t:
        # keys and value are usually column slices of one projection output: read them in place
        keys = keys if keys.stride(2) == 1 and keys.stride(1) == h else keys.contiguous()
        value = value if value.stride(1) == 1 else value.contiguous()
        mask = token_mask if token_mask is not None else streams
        _gate_kernel[(t, m)](
            streams.contiguous(), keys, value, weights.float().contiguous(), mask.contiguous(), out, m, h,
            eps, h**-0.5, keys.stride(0), value.stride(0), HAS_MASK=token_mask is not None,
            CHUNK=min(_GATE_CHUNK, triton.next_power_of_2(h)),
        )
    return out
