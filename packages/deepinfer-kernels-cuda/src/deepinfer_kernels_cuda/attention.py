"""Sparse attention with a per-head sink over a gathered KV buffer (one shared K=V head).

One program takes one query row with all its heads (a [heads, D] tile, so each gathered KV row is
read once for every head) over a range of its selected keys, with an online softmax in float32 and
tensor-core products (probabilities rounded to the KV dtype for the P.V product, as flash attention
does). Work is spread over the chip two ways:
* the value channels are cut into DV blocks (each program still needs all D channels for the
  scores; its DV block of the same rows is then re-read from L1/L2, not from HBM);
* for few query rows (decode), the selected keys are split into ranges whose partial results
  (normalised output and log-sum-exp) a second kernel merges together with the sink.
Prefill (many rows) runs one range per row and applies the sink in the first kernel.
The tiles and the split count depend on the number of rows, so results are not batch-invariant yet.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_LOG2E = math.log2(math.e)
_MAX_HEADS = 64  # heads per program (one warpgroup-sized MMA tile)


@dataclass(frozen=True)
class Tiles:
    dv_block: int  # value channels per program: bounds the [heads, DV] float32 accumulator
    block_n: int  # keys per step
    num_warps: int
    num_stages: int
    programs_per_sm: float = 1.0  # decode: split the keys until the grid has this many programs per SM
    min_split_keys: int = 64  # decode: fewest keys per split (each split re-reads q, writes [heads, D])


DECODE_TILES = Tiles(dv_block=256, block_n=32, num_warps=4, num_stages=2, programs_per_sm=2.0)
PREFILL_TILES = Tiles(dv_block=256, block_n=32, num_warps=4, num_stages=2)


@triton.jit
def _sink_attention_kernel(
    q_ptr, kv_ptr, idx_ptr, sink_ptr, out_ptr, part_ptr, lse_ptr,
    heads, D, K, keys_per_split, n_splits, scale_log2,
    q_stride_t, q_stride_h, kv_stride, idx_stride,
    SPLIT: tl.constexpr, DV_BLOCKS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
):
    t, s = tl.program_id(0), tl.program_id(1)
    hb, dvb = tl.program_id(2) // DV_BLOCKS, tl.program_id(2) % DV_BLOCKS
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dv = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + t.to(tl.int64) * q_stride_t + h[:, None] * q_stride_h + d[None, :],
                mask=(h < heads)[:, None] & (d < D)[None, :], other=0.0)
    m_i = tl.full((BLOCK_H,), -1.0e30, tl.float32)  # finite: an all-padding block must not make NaNs
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)
    lo = s * keys_per_split
    hi = tl.minimum(lo + keys_per_split, K)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + t.to(tl.int64) * idx_stride + n, mask=n < hi, other=-1)
        valid = idx >= 0
        rows = tl.where(valid, idx, 0).to(tl.int64) * kv_stride
        k = tl.load(kv_ptr + rows[:, None] + d[None, :], mask=valid[:, None] & (d < D)[None, :], other=0.0)
        logits = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        logits = tl.where(valid[None, :], logits, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DV_BLOCKS == 1:
            v = k
        else:
            vmask = valid[:, None] & (dv < D)[None, :]
            v = tl.load(kv_ptr + rows[:, None] + dv[None, :], mask=vmask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    hmask = h < heads
    omask = hmask[:, None] & (dv < D)[None, :]
    if SPLIT:
        row = (t * n_splits + s).to(tl.int64) * heads + h
        o = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
        tl.store(part_ptr + row[:, None] * D + dv[None, :], o, mask=omask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_i), -float("inf"))
        tl.store(lse_ptr + row, lse, mask=hmask)  # every DV block computes the same value
    else:
        sink = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
        top = tl.maximum(m_i, sink)
        a = tl.exp2(m_i - top)
        o = acc * (a / (l_i * a + tl.exp2(sink - top)))[:, None]
        tl.store(out_ptr + t.to(tl.int64) * q_stride_t + h[:, None] * q_stride_h + dv[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=omask)


@triton.jit
def _combine_kernel(
    part_ptr, lse_ptr, sink_ptr, out_ptr, heads, D, n_splits, out_stride_t, out_stride_h,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t, h = tl.program_id(0), tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    row = (t * n_splits + s).to(tl.int64) * heads + h
    lse = tl.load(lse_ptr + row, mask=s < n_splits, other=-float("inf"))
    sink = tl.load(sink_ptr + h).to(tl.float32) * 1.4426950408889634
    top = tl.maximum(tl.max(lse, axis=0), sink)
    w = tl.exp2(lse - top)
    o = tl.load(part_ptr + row[:, None] * D + d[None, :], mask=(s < n_splits)[:, None] & (d < D)[None, :],
                other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / (tl.sum(w, axis=0) + tl.exp2(sink - top))
    tl.store(out_ptr + t.to(tl.int64) * out_stride_t + h * out_stride_h + d, out.to(out_ptr.dtype.element_ty),
             mask=d < D)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the Triton interpreter on CPU: plan as for an H200
    return torch.cuda.get_device_properties(device).multi_processor_count


def sparse_attention_sink(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """o[t, h] = sum_k softmax_k(q[t, h] . kv[i_tk] * scale | sink[h]) kv[i_tk].

    q [T, heads, D]; kv [N, D]; indices [T, K] into kv, -1 = no key; sink [heads]. -> q's dtype.
    """
    t, heads, d = q.shape
    if kv.shape[-1] != d or indices.shape[0] != t or sink.shape != (heads,):
        raise ValueError(f"sparse_attention_sink: q {tuple(q.shape)}, kv {tuple(kv.shape)}, indices "
                         f"{tuple(indices.shape)}, sink {tuple(sink.shape)} do not fit")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    q = q.contiguous()
    kv = kv.to(q.dtype) if kv.stride(-1) == 1 else kv.to(q.dtype).contiguous()
    indices, sink = indices.contiguous(), sink.float().contiguous()
    k = indices.shape[1]
    block_h = max(16, min(_MAX_HEADS, triton.next_power_of_2(heads)))
    block_d = max(16, triton.next_power_of_2(d))
    sms = _sm_count(q.device)
    row_programs = t * triton.cdiv(heads, block_h)
    tiles, splits = PREFILL_TILES, 1
    if row_programs * triton.cdiv(block_d, PREFILL_TILES.dv_block) < sms:  # too few rows: split the keys
        tiles = DECODE_TILES
        programs = row_programs * triton.cdiv(block_d, tiles.dv_block)
        wanted = triton.cdiv(int(tiles.programs_per_sm * sms), programs)
        splits = min(wanted, triton.cdiv(k, tiles.min_split_keys))
    block_dv = min(block_d, tiles.dv_block)
    dv_blocks = block_d // block_dv
    key_blocks = max(1, triton.cdiv(k, tiles.block_n))
    keys_per_split = triton.cdiv(key_blocks, max(1, splits)) * tiles.block_n
    splits = max(1, triton.cdiv(k, keys_per_split))
    if splits > 1:
        part = torch.empty(t, splits, heads, d, dtype=torch.float32, device=q.device)
        lse = torch.empty(t, splits, heads, dtype=torch.float32, device=q.device)
    else:
        part = lse = out  # unused
    grid = (t, splits, triton.cdiv(heads, block_h) * dv_blocks)
    _sink_attention_kernel[grid](
        q, kv, indices, sink, out, part, lse, heads, d, k, keys_per_split, splits, scale * _LOG2E,
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0),
        SPLIT=splits > 1, DV_BLOCKS=dv_blocks, BLOCK_H=block_h, BLOCK_N=tiles.block_n, BLOCK_D=block_d,
        BLOCK_DV=block_dv, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if splits > 1:
        _combine_kernel[(t, heads)](
            part, lse, sink, out, heads, d, splits, out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d,
        )
    return out
