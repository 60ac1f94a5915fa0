"""Block-scaled linears: y = x W^T with W in its release storage, decoded tile by tile in registers.

Three paths, chosen by the number of tokens M (`configs.GEMV_M`, `configs.DEQUANT_M`):

* M <= GEMV_M (decode), FP8, or a tuned GEMV config (`configs.is_gemv`) up to 8 tokens: a CUDA-core
  GEMV. Each program streams BN weight rows (BN divides 32, so one scale row) in K steps of 8-column
  chunks (8-byte weight loads, 16-byte input loads), BK / 8 chunks per step spread over the threads,
  so BN x chunks-per-thread independent loads per thread per step; num_stages 2 prefetches the next
  step into registers, num_stages >= 3 lets Triton's pipeliner keep num_stages - 1 steps in flight
  through cp.async (ptxas alone does not issue a step's loads ahead of its first products). Each
  chunk's 8 products are summed in registers and then scaled (a power of two: exact). Small
  rows-per-program counts fill the SMs without splitting K; where they cannot, K splits (float32
  partials, then a fixed-order reduction: deterministic). A config with `pdl` launches it with
  programmatic dependent launch: its programs start while the previous kernel drains and wait for it
  (griddepcontrol.wait) before reading the input or writing; with register prefetch the first step's
  weights, which no kernel writes, load before the wait. A GEMV config with `tma` set takes one token
  through a persistent kernel instead (`_gemv_tma_kernel`): a few programs per SM, each walking its row
  blocks' K steps as one loop whose weight and input boxes stream through TMA (Triton's pipeliner keeps
  num_stages - 1 in flight), so no program waits on a single load and no partial last wave idles SMs.
* Otherwise below DEQUANT_M: the tiled kernel. Swap-AB: the decoded weight tile is the MMA's register A
  operand (BLOCK_N weight rows on the M side, which Hopper's wgmma needs >= 64 of), tokens its N side.
  Also serves FP4 and, in batch-invariant mode, dense weights, at every M.
* M >= DEQUANT_M: the weight is decoded once into a BF16 scratch copy and multiplied by cuBLAS: at
  prefill sizes decoding per token tile costs more issue slots than the MMAs (see docs/performance.md),
  and one decode pass (3 bytes moved per weight) is small against the GEMM.

Why BF16 MMA and not FP8 MMA: the reference multiplies unquantised (BF16) activations by the decoded
weights; FP8 MMA would need per-token-per-32 activation quantisation, which changes the numerics (~2^-4
relative per element) beyond the conformance tolerance. Decoding to BF16 is exact (power-of-two scales),
so every path equals the reference up to float32 summation order.

Dense (BF16/F32) weights, including the LM head, go to cuBLAS through torch: it streams a BF16 weight at
copy bandwidth at M=1 and is at its MMA peak at large M; `torch.mm(out_dtype=)` gives the float32 logits
from BF16 operands without the reference's float32 copy of the weight.

Batch-invariant mode (`batch_invariant=True`; docs/performance.md): every kind, at every M, runs the tiled
kernel with one base config per weight shape (`configs.invariant_linear`: decode-sized tiles, fixed K
steps and a fixed split-K count whose partials are summed in a fixed order), so a row's reduction order
never depends on the batch. Larger M take larger tiles with the same split and K order (on CUDA with
16-bit operands, where the wgmma chain makes the tile shape and, past 64 tokens, the K step irrelevant to
each output's sums; see `_invariant_tiles`), and sum the splits inside each program, in one pipelined loop
over the K steps, once the tiles fill the SMs. From DEQUANT_M tokens the weight is decoded once and the
same kernel runs on the dense copy: the same decoded values meet the same MMAs in the same order, so the
bits are those of the in-register decode.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from deepinfer.ops.reference import linear as reference_linear
from deepinfer_kernels_cuda import configs
from deepinfer_kernels_cuda.dequant import GROUP, dequantize, fp4_group_tile, fp8_tile, pow2

Kind = Literal["fp8", "fp4", "dense"]
_BLOCK_ROWS = tl.constexpr(GROUP)  # FP8 weights: one scale per 32x32 block
_KIND_CODE = {"fp8": 0, "fp4": 1, "dense": 2}
_CHUNK = tl.constexpr(8)  # GEMV: weight columns per chunk (one 8-byte load)
_ROW = tl.constexpr(256)  # TMA GEMV: columns per box row (the most TMA takes per dimension)
# torch.mm(..., out_dtype=) (aten::mm.dtype): BF16 operands, float32 accumulation and output
_MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()


@dataclass(frozen=True)
class PreparedLinear:
    """A weight in the kernel's layout: contiguous storage, scales as uint8 exponent bytes."""

    kind: Kind
    weight: torch.Tensor  # fp8 [N, K] | uint8 packed FP4 [N, K/2] | dense [N, K]
    scale: torch.Tensor | None  # uint8 [N/32, K/32] (fp8) | [N, K/32] (fp4)
    groups: int
    out_features: int
    in_features: int  # per group


def prepare_linear(
    kind: Kind,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    groups: int = 1,
    operand_dtype: torch.dtype | None = None,
) -> PreparedLinear:
    """`operand_dtype` BF16: a float32 dense weight (the LM head and compressor projections, F32 in
    NeMo's export) is stored in BF16, as the official engine's tables hold it, and multiplied BF16 x
    BF16 into float32: half the bytes of the float32 product (at decode the head alone is ~0.6 ms)."""
    if kind not in ("fp8", "fp4", "dense"):
        raise ValueError(f"linear kind {kind!r}: expected 'fp8', 'fp4' or 'dense'")
    if weight.ndim != 2:
        raise ValueError(f"{kind} weight: rank {weight.ndim}, expected [out, in]")
    n = weight.shape[0]
    k = weight.shape[1] * (2 if kind == "fp4" else 1)
    if groups < 1 or n % groups:
        raise ValueError(f"{kind} weight: {n} output rows do not split into {groups} groups")
    if kind == "dense":
        if scale is not None:
            raise ValueError("dense weight: unexpected scale")
        if weight.dtype == torch.float32 and operand_dtype == torch.bfloat16:
            weight = weight.to(torch.bfloat16)
        return PreparedLinear(kind, weight.contiguous(), None, groups, n, k)
    if scale is None:
        raise ValueError(f"{kind} weight: missing scale")
    if k % GROUP or (kind == "fp8" and (n // groups) % GROUP):
        # partial 32-blocks (only tiny test configs have them; every Flash width is a multiple of 32):
        # the tiles assume whole scale blocks, so such a weight stays on the reference path
        return reference_linear.prepare_linear(kind, weight, scale, groups)
    want_scale = (-(-n // GROUP), k // GROUP) if kind == "fp8" else (n, k // GROUP)
    if tuple(scale.shape) != want_scale:
        raise ValueError(f"{kind} scale: shape {tuple(scale.shape)}, expected {want_scale}")
    if kind == "fp8" and weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8 weight: dtype {weight.dtype}, expected float8_e4m3fn")
    if kind == "fp4" and weight.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"fp4 weight: dtype {weight.dtype}, expected packed int8/uint8")
    w = weight.contiguous() if kind == "fp8" else weight.contiguous().view(torch.uint8)
    return PreparedLinear(kind, w, scale.contiguous().view(torch.uint8), groups, n, k)


def compute_dtype(
    x_dtype: torch.dtype, out_dtype: torch.dtype, weight_dtype: torch.dtype = torch.bfloat16
) -> torch.dtype:
    """MMA operand dtype: out_dtype, except float32 outputs of BF16 inputs keep BF16 operands (every
    decoded or BF16 weight is exact in BF16 and products accumulate in float32, as in the reference)
    unless the weight itself is float32."""
    if out_dtype == torch.float32 and x_dtype == torch.bfloat16 and weight_dtype != torch.float32:
        return torch.bfloat16
    return out_dtype


@triton.jit
def dot_acc(a, b, acc, IEEE: tl.constexpr, ROW_SUMS: tl.constexpr = False):
    """acc + a @ b (float32 acc): tl.dot (IEEE: full float32 products), or with ROW_SUMS (batch-invariant
    mode off CUDA, i.e. the interpreter) the float32 products summed over K by tl.sum. The interpreter's
    tl.dot is numpy's matmul, whose BLAS kernel may sum an output differently by its place in the tile
    (OpenBLAS 0.3.31's Haswell sgemm on an AMD Zen 5: token columns 8-55 of a 64 x 64 by 64 x 64 product
    unlike 0-7, the MoE router's rows 6-15 of 16 unlike 0-5), so a token's bits followed its place in the
    batch; numpy's sum over an axis does the same adds, in K order, for every output. CUDA never sets it:
    the constexpr branch is not traced there, so the kernels keep their tl.dot."""
    if ROW_SUMS:
        acc = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        acc = tl.dot(a, b, acc, input_precision="ieee" if IEEE else None)
    return acc


@triton.jit
def _k_step(x_ptr, w_ptr, s_ptr, offs_n, offs_m, n_mask, m_mask, x_col, k0, k_hi, acc,
            stride_xm, stride_wn, stride_sn, KIND: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            IEEE: tl.constexpr, EVEN_K: tl.constexpr, ROW_SUMS: tl.constexpr):
    """acc + the products of columns k0..k0+BK (none past k_hi)."""
    offs_k = k0 + tl.arange(0, BK)
    k_in = offs_k < k_hi if not EVEN_K else tl.full((BK,), True, tl.int1)  # ragged K: dense only
    xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + (x_col + offs_k)[:, None],
                 mask=m_mask[None, :] & k_in[:, None], other=0.0)
    if KIND == 0:
        w = fp8_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK, _BLOCK_ROWS)
    elif KIND == 1:
        w = fp4_group_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK)
    else:  # dense; rows past N only feed output rows that are never stored
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                    mask=n_mask[:, None] & k_in[None, :], other=0.0)
    return dot_acc(w.to(xt.dtype), xt, acc, IEEE, ROW_SUMS)


@triton.jit
def _tile_k_steps(x_ptr, w_ptr, s_ptr, offs_n, offs_m, n_mask, m_mask, x_col, k_lo, k_hi,
                  stride_xm, stride_wn, stride_sn, KIND: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                  BK: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr, ROW_SUMS: tl.constexpr = False):
    """The float32 [BN, BM] sum of columns k_lo..k_hi (whole K steps from zero, one MMA chain; ROW_SUMS:
    `dot_acc`'s)."""
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    # every split has columns (`_split`); with no zero-trip path ptxas keeps wgmmas in flight (else C7515)
    tl.assume(k_hi > k_lo)
    for k0 in range(k_lo, k_hi, BK):
        acc = _k_step(x_ptr, w_ptr, s_ptr, offs_n, offs_m, n_mask, m_mask, x_col, k0, k_hi, acc,
                      stride_xm, stride_wn, stride_sn, KIND, BN, BK, IEEE, EVEN_K, ROW_SUMS)
    return acc


@triton.jit
def _split_loop_sums(x_ptr, w_ptr, s_ptr, offs_n, offs_m, n_mask, m_mask, x_col, K, k_per_split,
                     stride_xm, stride_wn, stride_sn, KIND: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                     BK: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr, ROW_SUMS: tl.constexpr):
    """Every split of K summed in one loop over the K steps, so the loads stay pipelined across the splits'
    boundaries (a loop per split drained the pipeline every 2-3 steps: q_a+kv's 14 splits of 3 steps):
    each split's chain from zero, added to the total in split order, split 0 taken as it is: the float32
    operations of the split grid plus `_split_reduce_kernel`. sm_90 compile (Triton 3.9): the K steps
    keep one wgmma group in flight; a split's end waits for its chain, adds it and zeroes the accumulator
    (no ptxas serialisation warning)."""
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    total = tl.zeros((BN, BM), dtype=tl.float32)
    tl.assume(K > 0)  # no zero-trip path (C7515, `_tile_k_steps`)
    for k0 in range(0, K, BK):
        acc = _k_step(x_ptr, w_ptr, s_ptr, offs_n, offs_m, n_mask, m_mask, x_col, k0, K, acc,
                      stride_xm, stride_wn, stride_sn, KIND, BN, BK, IEEE, EVEN_K, ROW_SUMS)
        end = k0 + BK
        if end % k_per_split == 0 or end >= K:  # a split's last step (splits are whole K steps)
            total = tl.where(end <= k_per_split, acc, total + acc)
            acc = tl.zeros((BN, BM), dtype=tl.float32)
    return total


@triton.jit
def _block_linear_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K, rows_per_group, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_om, stride_split,
    KIND: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT_LOOP: tl.constexpr = False, ROW_SUMS: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    n_mask = offs_n < N
    m_mask = offs_m < M
    x_col = (pid_n * BN // rows_per_group) * K  # the group's input chunk (BN divides rows_per_group)
    if SPLIT_LOOP:  # every split in this program (batch-invariant mode picks it or the grid by grid size)
        acc = _split_loop_sums(x_ptr, w_ptr, s_ptr, offs_n, offs_m, n_mask, m_mask, x_col, K, k_per_split,
                               stride_xm, stride_wn, stride_sn, KIND, BN, BM, BK, IEEE, EVEN_K, ROW_SUMS)
    else:
        k_lo = pid_k * k_per_split
        acc = _tile_k_steps(x_ptr, w_ptr, s_ptr, offs_n, offs_m, n_mask, m_mask, x_col, k_lo,
                            tl.minimum(k_lo + k_per_split, K), stride_xm, stride_wn, stride_sn,
                            KIND, BN, BM, BK, IEEE, EVEN_K, ROW_SUMS)
    ptrs = out_ptr + pid_k * stride_split + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def _gemv_weights(w_rows, k0, k_hi, n_mask, chunk, cols):
    """One GEMV K step's FP8 weights as stored; chunks past k_hi load nothing."""
    return tl.load(w_rows + k0 + cols, mask=n_mask[:, None, None, None] & ((k0 + chunk) < k_hi), other=0.0)


@triton.jit
def _gemv_inputs(x_rows, s_row, k0, k_hi, m_mask, chunk, cols, SCALE_WORDS: tl.constexpr):
    """One GEMV K step's input rows and the scale byte of each chunk's 32-column block (the program's
    rows share one scale row). Chunks past k_hi load nothing.
    SCALE_WORDS: the scale row is read as 32-bit words (4 blocks each) and the byte picked out, since
    Triton's pipeliner streams loads of >= 4 bytes per thread through cp.async but not byte loads."""
    k_in = (k0 + chunk) < k_hi
    xt = tl.load(x_rows + k0 + cols, mask=m_mask[None, :, None, None] & k_in, other=0.0)
    col = k0 + chunk
    if SCALE_WORDS:
        word_row = s_row.to(tl.pointer_type(tl.int32), bitcast=True)
        word = tl.load(word_row + col // (4 * _BLOCK_ROWS), mask=k_in, other=0)
        s = (word >> (8 * ((col // _BLOCK_ROWS) % 4))) & 0xFF
    else:
        s = tl.load(s_row + col // _BLOCK_ROWS, mask=k_in, other=127)
    return xt, s


@triton.jit
def _gemv_loads(x_rows, w_rows, s_row, k0, k_hi, m_mask, n_mask, chunk, cols, SCALE_WORDS: tl.constexpr):
    """One GEMV K step's operands: weights, input rows, scale bytes."""
    xt, s = _gemv_inputs(x_rows, s_row, k0, k_hi, m_mask, chunk, cols, SCALE_WORDS)
    return _gemv_weights(w_rows, k0, k_hi, n_mask, chunk, cols), xt, s


@triton.jit
def _gemv_chunk_sums(w, xt, s):
    """[rows, tokens, chunks, 1]: each chunk's 8 products (exact in float32) summed, then times its
    block's scale, a power of two: equal to the reference's sum of (w * 2^s) * x products up to order,
    at one multiply per chunk instead of one per element."""
    return tl.sum(w.to(tl.float32) * xt.to(tl.float32), axis=3, keep_dims=True) * pow2(s, 0)


@triton.jit
def _gemv_fp8_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K, rows_per_group, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_om, stride_split,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, SCALE_WORDS: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_mask = offs_n < N
    offs_m = tl.arange(0, BM)
    m_mask = offs_m < M
    # every tile is 4-D [rows, tokens, chunks, 8 columns]: the weight and input loads then get the same
    # register layout (8-column chunks; BK / 8 chunks over the threads, several per thread when BK is
    # larger than 8 x threads: that many independent loads per row per step), so the product needs no
    # shared-memory shuffle and the sum over the last axis stays inside a thread
    chunk = (tl.arange(0, BK // _CHUNK) * _CHUNK)[None, None, :, None]
    cols = chunk + tl.arange(0, _CHUNK)[None, None, None, :]
    x_rows = x_ptr + offs_m[None, :, None, None] * stride_xm + (pid_n * BN // rows_per_group) * K
    w_rows = w_ptr + offs_n[:, None, None, None] * stride_wn
    s_row = s_ptr + (pid_n * BN // _BLOCK_ROWS) * stride_sn  # BN divides 32: one scale row per program
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BN, BM, BK // _CHUNK, 1), dtype=tl.float32)
    # PDL (programmatic dependent launch): the program may start before the previous kernel has finished
    # and must wait for it before touching anything that kernel may write (the input, the output); the
    # weights it never writes, so with register prefetch the first step's weights load before the wait
    if STAGES == 2:  # register prefetch: the next step's loads are issued before this step's products
        w = _gemv_weights(w_rows, k_lo, k_hi, n_mask, chunk, cols)
        if PDL:
            gdc_wait()
        xt, s = _gemv_inputs(x_rows, s_row, k_lo, k_hi, m_mask, chunk, cols, SCALE_WORDS)
        for k0 in range(k_lo, k_hi, BK):
            w_next, xt_next, s_next = _gemv_loads(x_rows, w_rows, s_row, k0 + BK, k_hi, m_mask, n_mask,
                                                  chunk, cols, SCALE_WORDS)
            acc += _gemv_chunk_sums(w, xt, s)
            w, xt, s = w_next, xt_next, s_next
    else:  # STAGES 1: a step at a time; >= 3: Triton's pipeliner keeps STAGES - 1 steps in flight (cp.async)
        if PDL:
            gdc_wait()
        for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
            k0 = tl.multiple_of(k0, BK)
            w, xt, s = _gemv_loads(x_rows, w_rows, s_row, k0, k_hi, m_mask, n_mask, chunk, cols, SCALE_WORDS)
            acc += _gemv_chunk_sums(w, xt, s)
    ptrs = out_ptr + pid_k * stride_split + offs_m[None, :] * stride_om + offs_n[:, None]
    out = tl.sum(tl.sum(acc, axis=3), axis=2)
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def _gemv_tma_kernel(
    x_desc, w_desc, s_ptr, out_ptr, N, K, rows_per_group, stride_sn,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    """One token, persistent: program p of P takes row blocks p, p + P, ... and walks all their K steps as
    one flat loop, so its TMA pipeline (STAGES - 1 boxes of weights and input in flight) never drains
    between blocks. Boxes have 256-column rows (TMA moves a box row by row: narrower rows cost more
    requests per byte), tiles are [rows, BK/256, 256]; the input's scale is applied per 32 columns."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    steps = K // BK
    total = tl.cdiv(N // BN - pid, progs) * steps
    R: tl.constexpr = BK // _ROW
    word = tl.arange(0, 2 * R)  # a 32-bit scale word per 128 columns
    shift = (8 * tl.arange(0, 4))[None, :]
    # the scale row as 32-bit words: Triton's pipeliner streams them through cp.async (not byte loads)
    s_words = s_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    acc = tl.zeros((BN, R, _ROW), tl.float32)
    if PDL:  # the input and the output belong to the kernels around this one
        gdc_wait()
    for t in tl.range(0, total, num_stages=STAGES):
        row0 = (pid + (t // steps) * progs) * BN
        k0 = (t % steps) * BK
        w = w_desc.load([row0, k0 // _ROW, 0])
        xk = x_desc.load([((row0 // rows_per_group) * K + k0) // _ROW, 0])
        sw = tl.load(s_words + (row0 // _BLOCK_ROWS) * (stride_sn // 4) + k0 // 128 + word)
        # the block scale on the input (a power of two: exact), shared by the tile's rows
        scale = pow2((sw[:, None] >> shift) & 0xFF, 0)  # [2R, 4]: one per 32 columns
        xs = tl.reshape(tl.reshape(xk.to(tl.float32), (2 * R, 4, _BLOCK_ROWS)) * scale[:, :, None], (R, _ROW))
        acc += w.to(tl.float32) * xs[None, :, :]
        if t % steps == steps - 1:  # the block's last step: its rows are done
            y = tl.sum(tl.sum(acc, axis=2), axis=1)
            tl.store(out_ptr + row0 + tl.arange(0, BN), y.to(out_ptr.dtype.element_ty))
            acc = tl.zeros((BN, R, _ROW), tl.float32)


@triton.jit
def _split_reduce_kernel(part_ptr, out_ptr, numel, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):  # fixed order: the same bits every run
        acc += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _split(k: int, cfg: configs.TileConfig) -> tuple[int, int]:
    """(split count, columns per split): whole K steps per split, at most cfg.split_k splits."""
    steps = -(-k // cfg.block_k)
    per_split = -(-steps // min(cfg.split_k, steps)) * cfg.block_k
    return -(-k // per_split), per_split


def _launch(kernel, grid_n: int, grid_m: int | None, x: torch.Tensor, w: PreparedLinear,
            out_dtype: torch.dtype, cfg: configs.TileConfig, split_loop: bool = False,
            **meta) -> torch.Tensor:
    """Runs `kernel` over (N tiles[, M tiles], splits) and, for split K, the fixed-order reduction.
    split_loop (tiled kernel): every split inside each program instead (the same float32 operations)."""
    m, n, k = x.shape[0], w.out_features, w.in_features
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    split, per_split = _split(k, cfg)
    if split_loop:
        meta["SPLIT_LOOP"], split = True, 1
    target = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    scale = w.scale if w.scale is not None else w.weight  # dense: unused
    grid = (grid_n, split) if grid_m is None else (grid_n, grid_m, split)
    kernel[grid](
        x, w.weight, scale, target, m, n, k, n // w.groups, per_split,
        x.stride(0), w.weight.stride(0), scale.stride(0), n, m * n,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **meta,
    )
    if split > 1:
        block = 1024
        _split_reduce_kernel[(triton.cdiv(m * n, block),)](target, out, m * n, SPLIT=split, BLOCK=block)
    return out


def _operand(x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype) -> torch.Tensor:
    weight_dtype = w.weight.dtype if w.kind == "dense" else torch.bfloat16
    x = x.to(compute_dtype(x.dtype, out_dtype, weight_dtype))
    return x if x.stride(-1) == 1 else x.contiguous()


def _tiled_config(x: torch.Tensor, w: PreparedLinear, cfg: configs.TileConfig) -> configs.TileConfig:
    """`cfg` fitted to the operands and the weight shape: a function of (cfg, operand dtype, weight shape)
    alone, so a batch-invariant config keeps its K steps and split boundaries at every M."""
    if x.dtype == torch.float32:  # float32 operands (tiny test configs) take 2x the shared memory per stage
        cfg = replace(cfg, block_k=min(cfg.block_k, 64), num_stages=min(cfg.num_stages, 2))
    rows_per_group = w.out_features // w.groups
    if w.groups > 1 and rows_per_group % cfg.block_n:  # a tile must not straddle two groups
        cfg = replace(cfg, block_n=rows_per_group & -rows_per_group)  # largest power of two dividing it
    if cfg.block_n < 16:  # the MMA tile needs 16 rows
        raise ValueError(f"grouped linear: {rows_per_group} rows per group leave no tile of >= 16")
    k = w.in_features
    if k % GROUP == 0:  # whole scale blocks per K step (dense too: its decoded twin takes the same steps)
        cfg = replace(cfg, block_k=configs.block_k(k, cfg.block_k))
    elif k < cfg.block_k:  # dense only: a ragged last step
        cfg = replace(cfg, block_k=max(16, triton.next_power_of_2(k)))  # the MMA's K is >= 16
    return cfg


def tiled_linear(
    x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype, cfg: configs.TileConfig,
    split_loop: bool = False, row_sums: bool = False, k_step: int = 0,
) -> torch.Tensor:
    """x [M, groups * K] -> [M, N] through the tiled MMA kernel at `cfg` (any kind, any M); split_loop:
    each program sums cfg's K splits itself, in split order (the same bits as the split grid); row_sums
    (interpreter only, batch-invariant mode): products summed by tl.sum, not tl.dot (`dot_acc`); k_step:
    columns per K step where it divides cfg's (whose K steps still place the split boundaries)."""
    if row_sums and x.is_cuda:
        raise ValueError("tiled linear: row_sums is the interpreter's path (CUDA keeps tl.dot)")
    x = _operand(x, w, out_dtype)
    cfg = _tiled_config(x, w, cfg)
    k = w.in_features
    bk = k_step if k_step and cfg.block_k % k_step == 0 else cfg.block_k
    return _launch(
        _block_linear_kernel, triton.cdiv(w.out_features, cfg.block_n), triton.cdiv(x.shape[0], cfg.block_m),
        x, w, out_dtype, cfg, split_loop, KIND=_KIND_CODE[w.kind], BN=cfg.block_n, BM=cfg.block_m,
        BK=bk, IEEE=x.dtype == torch.float32, EVEN_K=k % bk == 0, ROW_SUMS=row_sums,
    )


def _pdl(cfg: configs.TileConfig, x: torch.Tensor) -> dict:
    """GEMV launch arguments for programmatic dependent launch where the config asks for it (CUDA sm_90 and
    newer: grid dependency control is a Hopper instruction; the interpreter has none)."""
    pdl = bool(cfg.pdl) and x.is_cuda and _sm90(x.device)
    return {"PDL": pdl, "launch_pdl": True} if pdl else {"PDL": False}


@functools.cache
def _sm90(device: torch.device) -> bool:
    """Hopper or newer: grid dependency control and TMA."""
    return torch.cuda.get_device_capability(device) >= (9, 0)


def _tma_fits(x: torch.Tensor, w: PreparedLinear) -> bool:
    """Whether `_gemv_tma_kernel` takes this call: one token on sm_90+, K in whole 256-column rows,
    16-byte aligned operands (TMA), scale rows in whole 32-bit words."""
    return (x.shape[0] == 1 and x.is_cuda and _sm90(x.device) and w.in_features % _ROW.value == 0
            and x.data_ptr() % 16 == 0 and w.weight.data_ptr() % 16 == 0
            and w.scale.stride(0) % 4 == 0 and w.scale.data_ptr() % 4 == 0)


def _gemv_tma(x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype,
              cfg: configs.TileConfig) -> torch.Tensor:
    """One token through `_gemv_tma_kernel`. cfg: block_n rows per box (dividing 32), block_k columns per
    K step (a power of two >= 256, fitted to K), num_stages pipeline stages, split_k programs per SM (as
    many as the row blocks allow in whole rounds: every SM then streams nearly the same bytes)."""
    n, k = w.out_features, w.in_features
    bk = configs.block_k(k, max(cfg.block_k, _ROW.value))
    blocks, sms = n // cfg.block_n, configs.sm_count(x.device)
    progs = sms * min(cfg.split_k, blocks // sms) if blocks >= sms else blocks
    row = _ROW.value
    x_desc = TensorDescriptor.from_tensor(x.view(-1, row), [bk // row, row])
    w_desc = TensorDescriptor.from_tensor(w.weight.view(n, k // row, row), [cfg.block_n, bk // row, row])
    out = torch.empty((1, n), dtype=out_dtype, device=x.device)
    _gemv_tma_kernel[(progs,)](
        x_desc, w_desc, w.scale, out, n, k, n // w.groups, w.scale.stride(0),
        BN=cfg.block_n, BK=bk, STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=1, **_pdl(cfg, x),
    )
    return out


def gemv_linear(
    x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype, cfg: configs.TileConfig
) -> torch.Tensor:
    """x [M, groups * K] -> [M, N] for a few tokens and an FP8 weight through the CUDA-core GEMV (one
    token at a `tma` config: the persistent TMA GEMV, where `_tma_fits`)."""
    if w.kind != "fp8" or GROUP % cfg.block_n or cfg.block_k % _CHUNK.value:
        raise ValueError(f"GEMV: {w.kind} weight with {cfg.block_n} x {cfg.block_k} tiles "
                         "(needs fp8, rows dividing 32, columns a multiple of 8)")
    x = _operand(x, w, out_dtype)
    if cfg.tma and _tma_fits(x, w):
        return _gemv_tma(x, w, out_dtype, cfg)
    scale_words = w.scale.stride(0) % 4 == 0 and w.scale.data_ptr() % 4 == 0
    return _launch(
        _gemv_fp8_kernel, triton.cdiv(w.out_features, cfg.block_n), None, x, w, out_dtype,
        replace(cfg, num_stages=1), BN=cfg.block_n, BM=triton.next_power_of_2(x.shape[0]), BK=cfg.block_k,
        STAGES=cfg.num_stages, SCALE_WORDS=scale_words, **_pdl(cfg, x),
    )


def block_linear(
    x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype, config: configs.TileConfig | None = None
) -> torch.Tensor:
    """x [M, groups * K] -> [M, N] for a prepared fp8/fp4 weight below DEQUANT_M tokens: the GEMV for
    FP8 at a GEMV config (the default's up to GEMV_M tokens), else the tiled kernel (`config` overrides
    the table)."""
    m = x.shape[0]
    cfg = config or configs.lookup(w.kind, w.out_features, w.in_features, m, x.device)
    if w.kind == "fp8" and configs.is_gemv(cfg):
        return gemv_linear(x, w, out_dtype, cfg)
    return tiled_linear(x, w, out_dtype, cfg)


def _decoded(w: PreparedLinear, dtype: torch.dtype) -> PreparedLinear:
    """A block-scaled weight decoded once into a dense scratch copy (exact in BF16 and float32)."""
    dense = dequantize(w.kind, w.weight, w.scale, w.out_features, w.in_features, dtype)
    return replace(w, kind="dense", weight=dense, scale=None)


def dequant_linear(x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype) -> torch.Tensor:
    """Many tokens: the weight decoded once into a scratch copy in the operand dtype, then cuBLAS."""
    return dense_linear(x, _decoded(w, compute_dtype(x.dtype, out_dtype)), out_dtype)


def dense_linear(x: torch.Tensor, w: PreparedLinear, out_dtype: torch.dtype) -> torch.Tensor:
    weight = w.weight
    if w.groups > 1:
        g = w.groups
        xg = x.reshape(x.shape[0], g, -1).transpose(0, 1).to(out_dtype)
        wg = weight.reshape(g, -1, weight.shape[1]).to(out_dtype)
        return torch.bmm(xg, wg.transpose(1, 2)).transpose(0, 1).reshape(x.shape[0], -1)
    return mm_out(x, weight, out_dtype)


def mm_out(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """x weight^T in out_dtype; float32 results of BF16 operands without float32 copies of them (equal to
    the reference's float32 product up to summation order: BF16 products are exact in float32)."""
    bf16 = x.dtype == weight.dtype == torch.bfloat16
    if out_dtype == torch.float32 and bf16 and x.is_cuda and _MM_OUT_DTYPE:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.to(out_dtype), weight.to(out_dtype))


def _as_dense(prepared: reference_linear.ReferenceLinear, dtype: torch.dtype) -> PreparedLinear:
    """A reference-prepared weight (partial 32-blocks: tiny test configs) decoded for the tiled kernel."""
    w = prepared.dequantized(dtype)
    return PreparedLinear("dense", w, None, prepared.groups, w.shape[0], w.shape[1])


def _invariant_tiles(base: configs.TileConfig, m: int, n: int, x: torch.Tensor,
                     weight_bytes: int = 2, k: int = 0) -> tuple[configs.TileConfig, bool, int]:
    """Batch-invariant tiles at M tokens: (config, split inside each program, columns per K step; 0: the
    config's).

    Each output's float32 operations are fixed by the K splits (`_tiled_config` of the base config and the
    weight shape, `_split`) and the MMA's K order, which never change. On CUDA with 16-bit operands the
    MMA is wgmma, and a wgmma chain gives each output the same k16 products and adds in K order whatever
    the token tile (its N side), the rows per tile (one m64 MMA per warpgroup), the columns per K step
    (k16 MMAs in column order; one MMA per step here, as the weight is decoded whole), the warps or the
    pipeline stages: those follow M there (the base's decode tile up to 16 tokens, 32/64-token tiles to
    64, then `INVARIANT_SHAPE_TILES` where the weight shape (n rows, k columns) and M match and
    `INVARIANT_LARGE_TILES` as far as an estimate of the shared memory allows; `weight_bytes`:
    bytes per stored weight element, 1 where decoded in registers). Float32 operands (FMA dots) and the
    interpreter (numpy matmuls, whose sums depend on the matrix shapes) keep one tile, the base's with 64
    tokens. The split runs as a grid plus `_split_reduce_kernel` while the output tiles alone leave SMs
    idle (half of them past 64 tokens), else inside each program (`SPLIT_LOOP`: the same adds)."""
    k_step = 0
    if not x.is_cuda or x.dtype == torch.float32:
        cfg = replace(base, block_m=64)
    elif m <= 16:
        cfg = base
    elif m <= 64:
        cfg = replace(base, block_m=configs.m_bucket(m))
    else:  # the first large tile whose stages fit the shared memory, else the smallest
        shaped = [tile for (rows, cols, tokens), tile in INVARIANT_SHAPE_TILES if n >= rows and k >= cols
                  and m >= tokens]
        for bn, bm, bk, warps, stages in (*shaped, *INVARIANT_LARGE_TILES):
            cfg = replace(base, block_n=max(base.block_n, bn), block_m=bm, num_warps=warps, num_stages=stages)
            k_step = bk if bk and base.block_k % bk == 0 else 0
            if _smem_bytes(cfg, weight_bytes, k_step) <= _SMEM_BUDGET:
                break
    tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m)
    # past 64 tokens the partial sums outweigh a wave's idle SMs sooner (kv at 2048 tokens: 128 tiles x 16
    # splits of float32 partials, 64 MB, made it 3.3x the default)
    return cfg, base.split_k > 1 and tiles * (2 if m > 64 else 1) >= configs.sm_count(x.device), k_step


# invariant tiles past 64 tokens, best first: (rows, tokens, K step (0: the base's), warps, stages). K steps
# of 64 (the base configs take 128-256 at M = 1) quarter a 128 x 128 stage of BF16 operands to 32 KB: four
# stages, or two programs per SM at three (without an in-program split: 108 registers at 8 warps), where
# 128-column steps had room for 3 stages and one program (sm_90 compile, Triton 3.9). Module-level:
# benchmarks swap them.
INVARIANT_LARGE_TILES = ((128, 128, 64, 8, 4), (128, 64, 64, 8, 4), (128, 64, 64, 8, 2), (64, 64, 64, 4, 2))
# tried first where the weight has at least these (out rows, in columns) and M these tokens: H200 2026-12-02
# (benchmarks/kernels/invariant_prefill.py, 4096 tokens, eager us, each bitwise alone vs in the batch) against
# the list's first tile: q_b+indexer 36864 x 1280 at 128 x 256 tokens 806 vs 1021; K steps of 128 in 3
# stages: o_b 5120 x 8192 763 vs 821, o_a 8 x (1024 x 4096) 664 vs 693, q_a+kv 1792 x 5120 201 vs 210 (kv
# 512 x 5120: 111 vs 90, so it keeps the list). Timed at 4096 tokens only: from 1024 tokens here.
INVARIANT_SHAPE_TILES = (((16384, 0, 1024), (128, 256, 64, 8, 3)),
                         ((1024, 4096, 1024), (128, 128, 128, 8, 3)))
_SMEM_BUDGET = 200 << 10  # of the H100/H200's 227 KB per block, with room for Triton's own scratch


def _smem_bytes(cfg: configs.TileConfig, weight_bytes: int, k_step: int = 0) -> int:
    """Shared memory of a tiled-kernel config, estimated: its pipeline stages of weight and input tiles
    plus, for a weight decoded in registers (1-byte storage), one BF16 tile for the move into the MMA's
    operand layout."""
    bk = k_step or cfg.block_k
    stage = cfg.block_n * bk * weight_bytes + bk * cfg.block_m * 2
    return cfg.num_stages * stage + (cfg.block_n * bk * 2 if weight_bytes == 1 else 0)


def linear(
    x: torch.Tensor,
    prepared: PreparedLinear | reference_linear.ReferenceLinear,
    out_dtype: torch.dtype,
    *,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """y = x W^T in `out_dtype` for a weight from `prepare_linear`; x [..., groups * in].

    `batch_invariant`: the tiled kernel at the weight shape's one config for every M (module docstring)."""
    if isinstance(prepared, reference_linear.ReferenceLinear):
        if not batch_invariant:
            return reference_linear.linear(x, prepared, out_dtype)
        prepared = _as_dense(prepared, out_dtype)  # the reference decodes into out_dtype
    lead = x.shape[:-1]
    if x.shape[-1] != prepared.groups * prepared.in_features:
        raise ValueError(
            f"linear input width {x.shape[-1]}, expected {prepared.groups} x {prepared.in_features}"
        )
    x2 = x.reshape(-1, x.shape[-1])
    n, k = prepared.out_features, prepared.in_features
    if batch_invariant:
        base = configs.invariant_linear(prepared.kind, n, k, x.device)
        if prepared.kind != "dense" and x2.shape[0] >= configs.DEQUANT_M:
            # the same K steps and MMAs on the weight decoded once: the in-register decode's bits
            prepared = _decoded(prepared, compute_dtype(x.dtype, out_dtype))
        x2 = _operand(x2, prepared, out_dtype)
        cfg, split_loop, k_step = _invariant_tiles(base, x2.shape[0], n, x2, prepared.weight.element_size(),
                                                   k)
        # off CUDA (the interpreter) products summed by tl.sum: its numpy matmul's sums follow a
        # token's place in the tile (`dot_acc`)
        y = tiled_linear(x2, prepared, out_dtype, cfg, split_loop, row_sums=not x2.is_cuda, k_step=k_step)
    elif prepared.kind == "dense":
        y = dense_linear(x2, prepared, out_dtype)
    elif x2.shape[0] >= configs.DEQUANT_M:
        y = dequant_linear(x2, prepared, out_dtype)
    else:
        y = block_linear(x2, prepared, out_dtype)
    return y.reshape(*lead, prepared.out_features)
