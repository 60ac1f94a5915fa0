"""mHC: fused coefficients (projection, RMS factor, sigmoids, Sinkhorn), collapse and expansion.

`hc_coefficients` is a skinny product [T, m*H] x [m*H, m(m+2)] (K = 20480, N = 24 at Flash width).
The projection kernel splits K into chunks and writes float32 partial products and sums of squares; a
finish kernel sums each row's chunks and computes the RMS factor, pre/post sigmoids and the 20 Sinkhorn
iterations on the m x m matrix, in registers. The product is float32-accurate (the reference is a float32
matmul). Two paths, measured on the H200 (2026-12-02):
* latency (default mode, T <= 64): 16-row tiles over 256-column chunks (80 programs a row block at Flash:
  every SM reads a slice of the ~2 MB matrix at once); bf16 streams enter as exact bf16 operands against
  the matrix split in three bf16 parts (hi + mid + lo carry all 24 bits); one finish program per row sums
  its chunks as one tile. T=1 12.7 us, T=64 22 us (the rows path: 26 / 42 us).
* split (default mode, bf16 streams, T > 64: a prefill): the matrix is split once per call into its
  three bf16 parts (a [3, 32, K] bf16 copy, ~4 MB), so both operands of the three bf16 products enter
  the tensor cores straight from memory and Triton pipelines their loads (the latency path's in-register
  split and the rows path's float32 operands are not pipelined: the streams were read at ~0.4 TB/s);
  256-column chunks (longer chains in the tensor cores' accumulators lost float32 accuracy: 1024-column
  chunks missed the reference's expansion by 2-3 bf16 ulps in 36 of 42M values at T=2048), finish
  programs of 8 rows. T=2048: projection 44 us, finish 38 us, split 2.6 us (H200, profile_step, session 10).
* rows (float32 streams past 64 rows, and their batch-invariant mode at every T): 3xTF32 in 64-row tiles
  (16 at T <= 16 outside invariant mode) over 512-column chunks, finish programs of 32 rows summing the
  chunks in order. T=2048 160 us.
`batch_invariant` takes one path at every T, so a row's bits do not depend on T: for bf16 streams the split
path (its tiles never depended on T; a row's products are a wgmma row, whatever its place in the 64-row
tile) finished by one program per row (`_hc_finish_row_kernel`: the chunk sums as one tree, as on the
latency path: fast at T=1, where the 8-row finish's chunk loop is one program's latency), for float32 ones
the rows path. Before, bf16 streams took the rows path in invariant mode too (H200: 33.5 us at T=1 against
the latency kernels' 10.7; 160 us at T=2048 against the split path's ~85).
Fused ops: `hc_residual` (coefficients + expansion; on the latency path each expansion program finishes
its row's coefficients from the partials, so no finish launch) and `hc_collapse_norm` (collapse +
RMSNorm in one program per row).
"""

import torch
import triton
import triton.language as tl

from deepinfer_kernels_cuda.norm import rms_norm_values, row_warps

_BLOCK_K = 128
_LATENCY_CHUNK = 256  # projection columns per program on the latency path
_ROWS_CHUNK = 512  # ... on the rows path (40 programs a row block at Flash)
_LATENCY_ROWS = 64  # default mode up to this many rows: the latency path
_RESIDUAL_BLOCK_H = 512  # columns per program of the expansion that finishes the coefficients ...
_RESIDUAL_WARPS = 1  # ... and its warps (one: the Sinkhorn's reductions stay within a warp)
# the split path (bf16 streams past _LATENCY_ROWS rows, default mode: a prefill): tile rows, columns per
# program, columns per step, warps, pipeline stages; and rows per program of its finish
# 256 columns per program: the tensor cores' float32 accumulation loses accuracy with the chain's length
# (H200, 2048 x 20480 streams, max |projection - float64|: 4.2e-5 at 1024 columns, 2.3e-5 at 512, 9.7e-6 at
# 256, the float32 reference's own 8.3e-6). It costs time (profile_step, T=2048, per call): projection 36 ->
# 44 us, finish 13 -> 38 us (it reads 80 partials a row instead of 20). CHAIN: columns per tensor-core
# accumulation chain inside a program (0 = K_CHUNK); 256 in 1024-column programs would keep the accuracy
# with a quarter of the partials: written, not yet timed on a GPU
_SPLIT_TILE = {"BLOCK_T": 64, "K_CHUNK": 256, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4, "CHAIN": 0}
_SPLIT_FINISH_ROWS = 8


@triton.jit
def _dot_bf16x3(x, w, acc):
    """acc + x . w for bf16 x and float32 w [K, N], float32-accurate: w = hi + mid + lo in bf16 exactly
    enough (each part carries the next 8 bits of the significand; the residues are exact in float32)."""
    hi = w.to(tl.bfloat16)
    rest = w - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    acc = tl.dot(x, lo, acc)
    acc = tl.dot(x, mid, acc)
    return tl.dot(x, hi, acc)


@triton.jit
def _sinkhorn(z, hc_eps, ITERS: tl.constexpr, OUT_AXIS: tl.constexpr, IN_AXIS: tl.constexpr):
    """comb logits -> row softmax over OUT_AXIS, then ITERS alternations of column / row normalisation."""
    e = tl.exp(z - tl.max(z, axis=OUT_AXIS, keep_dims=True))
    c = e / tl.sum(e, axis=OUT_AXIS, keep_dims=True) + hc_eps
    c = c / (tl.sum(c, axis=IN_AXIS, keep_dims=True) + hc_eps)
    for _ in tl.static_range(ITERS - 1):
        c = c / (tl.sum(c, axis=OUT_AXIS, keep_dims=True) + hc_eps)
        c = c / (tl.sum(c, axis=IN_AXIS, keep_dims=True) + hc_eps)
    return c


@triton.jit
def _chunk_sum(part_ptr, rows, live, col, scale):
    """scale * sum over the row's chunks (a [S, ...] tile, reduced as one tree) of the partials at `col`."""
    return tl.sum(tl.load(part_ptr + rows + col, mask=live, other=0.0), axis=0) * scale


# row counts are not specialised (== 1, multiple of 16): a new batch size compiles nothing
@triton.jit(do_not_specialize=["T"])
def _hc_project_kernel(
    x_ptr, fn_ptr, part_ptr, sq_ptr, T, K, x_stride, fn_stride, n_out, K_CHUNK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BF16_SPLIT: tl.constexpr,
    ROW_SUMS: tl.constexpr = False,
):
    """ROW_SUMS (batch-invariant mode in the interpreter): the products summed over K by tl.sum instead of
    tl.dot, for the reason `linear.dot_acc` gives (the interpreter's BLAS sums a row by its place in the
    tile; here rows 6-11, 18-23, ... of a 64 x 128 by 128 x 32 product unlike rows 0-5). Not dot_acc
    itself: the tensor-core path here is 3xTF32, which dot_acc does not take. On CUDA tl.dot stays."""
    pid_t, split = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    sq = tl.zeros((BLOCK_T,), tl.float32)
    for k0 in range(split * K_CHUNK, tl.minimum(split * K_CHUNK + K_CHUNK, K), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + t[:, None].to(tl.int64) * x_stride + k[None, :],
                    mask=(t < T)[:, None] & (k < K)[None, :], other=0.0)
        w = tl.trans(tl.load(fn_ptr + j[:, None] * fn_stride + k[None, :],
                             mask=(j < n_out)[:, None] & (k < K)[None, :], other=0.0))
        xf = x.to(tl.float32)
        sq += tl.sum(xf * xf, axis=1)
        if BF16_SPLIT:
            acc = _dot_bf16x3(x, w, acc)
        elif ROW_SUMS:
            acc += tl.sum(xf[:, :, None] * w[None, :, :], axis=1)
        else:
            acc = tl.dot(xf, w, acc, input_precision="tf32x3")
    base = split.to(tl.int64) * T + t
    tl.store(part_ptr + base[:, None] * BLOCK_N + j[None, :], acc, mask=(t < T)[:, None])
    tl.store(sq_ptr + base, sq, mask=t < T)


@triton.jit
def _split_bf16x3_kernel(fn_ptr, out_ptr, n_out, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fn [n_out, K] float32 -> out [3, BLOCK_N, K] bf16: lo, mid, hi (`_dot_bf16x3`'s parts; rows past
    n_out zero)."""
    j = tl.program_id(0)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    w = tl.load(fn_ptr + j * K + k, mask=k < tl.where(j < n_out, K, 0), other=0.0)
    hi = w.to(tl.bfloat16)
    rest = w - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    tl.store(out_ptr + j * K + k, lo, mask=k < K)
    tl.store(out_ptr + (BLOCK_N + j) * K + k, mid, mask=k < K)
    tl.store(out_ptr + (2 * BLOCK_N + j) * K + k, hi, mask=k < K)


@triton.jit
def _part_dot(x, w, acc, ROW_SUMS: tl.constexpr):
    """acc + x . w: tl.dot, or with ROW_SUMS (batch-invariant mode in the interpreter) the products summed
    over K by tl.sum (`_hc_project_kernel`'s docstring)."""
    if ROW_SUMS:
        return acc + tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)
    return tl.dot(x, w, acc)


@triton.jit
def _split_step(x_ptr, w_ptr, t, j, k0, T, K, x_stride, acc, sq, BLOCK_K: tl.constexpr,
                BLOCK_N: tl.constexpr, ROW_SUMS: tl.constexpr = False):
    """One BLOCK_K step of `_hc_project_split_kernel`: acc + the three products, sq + the squares."""
    k = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + t[:, None].to(tl.int64) * x_stride + k[None, :],
                mask=(t < T)[:, None] & (k < K)[None, :], other=0.0)
    w = w_ptr + j[None, :] * K + k[:, None]  # [BLOCK_K, BLOCK_N] of the lo part
    kmask = (k < K)[:, None]
    xf = x.to(tl.float32)
    sq += tl.sum(xf * xf, axis=1)
    acc = _part_dot(x, tl.load(w, mask=kmask, other=0.0), acc, ROW_SUMS)
    acc = _part_dot(x, tl.load(w + BLOCK_N * K, mask=kmask, other=0.0), acc, ROW_SUMS)
    acc = _part_dot(x, tl.load(w + 2 * BLOCK_N * K, mask=kmask, other=0.0), acc, ROW_SUMS)
    return acc, sq


@triton.jit(do_not_specialize=["T"])
def _hc_project_split_kernel(
    x_ptr, w_ptr, part_ptr, sq_ptr, T, K, x_stride, K_CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, CHAIN: tl.constexpr = 0, ROW_SUMS: tl.constexpr = False,
):
    """`_hc_project_kernel`'s partials for bf16 streams against the matrix already split in its three
    bf16 parts (w [3, BLOCK_N, K]: lo, mid, hi): both operands of the three products enter the tensor
    cores straight from memory, so the loads are pipelined (the streams are read once, at copy speed).
    CHAIN (0: K_CHUNK) < K_CHUNK: the tensor cores accumulate CHAIN columns at a time, each chain's sum
    added to the program's in float32 registers (their accumulation loses accuracy with the chain's
    length: `_SPLIT_TILE`), so a program may cover more columns, and the finish read fewer partials.
    ROW_SUMS: `_part_dot`."""
    pid_t, split = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    sq = tl.zeros((BLOCK_T,), tl.float32)
    end = tl.minimum(split * K_CHUNK + K_CHUNK, K)
    if CHAIN == 0 or CHAIN >= K_CHUNK:  # the measured default (session 10): one chain a program
        for k0 in range(split * K_CHUNK, end, BLOCK_K):
            acc, sq = _split_step(x_ptr, w_ptr, t, j, k0, T, K, x_stride, acc, sq, BLOCK_K, BLOCK_N, ROW_SUMS)
    else:
        for c0 in range(split * K_CHUNK, end, CHAIN):
            chain = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
            for k0 in range(c0, tl.minimum(c0 + CHAIN, end), BLOCK_K):
                chain, sq = _split_step(x_ptr, w_ptr, t, j, k0, T, K, x_stride, chain, sq, BLOCK_K, BLOCK_N,
                                        ROW_SUMS)
            acc += chain
    base = split.to(tl.int64) * T + t
    tl.store(part_ptr + base[:, None] * BLOCK_N + j[None, :], acc, mask=(t < T)[:, None])
    tl.store(sq_ptr + base, sq, mask=t < T)


@triton.jit
def _row_coefficients(
    part_ptr, sq_ptr, base_ptr, scale_ptr, t, T, K, splits, hc_eps, norm_eps, ITERS: tl.constexpr,
    M: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Row t's (pre [M], post [M], comb [M (in), M (out)]) from its chunk partials: RMS factor, sigmoids,
    Sinkhorn."""
    s = tl.arange(0, SPLITS)
    live = s < splits
    rms = tl.rsqrt(tl.sum(tl.load(sq_ptr + s * T + t, mask=live, other=0.0), axis=0) / K + norm_eps)
    rows = (s * T + t) * BLOCK_N
    i = tl.arange(0, M)
    z_pre = tl.load(base_ptr + i) + _chunk_sum(
        part_ptr, rows[:, None], live[:, None], i[None, :], rms * tl.load(scale_ptr))
    z_post = tl.load(base_ptr + M + i) + _chunk_sum(
        part_ptr, rows[:, None], live[:, None], M + i[None, :], rms * tl.load(scale_ptr + 1))
    # comb logits [i (in), j (out)]: row softmax, then alternate column / row normalisation
    cell = i[:, None] * M + i[None, :]
    z = tl.load(base_ptr + 2 * M + cell) + _chunk_sum(
        part_ptr, rows[:, None, None], live[:, None, None], 2 * M + cell[None, :, :],
        rms * tl.load(scale_ptr + 2))
    return tl.sigmoid(z_pre) + hc_eps, 2 * tl.sigmoid(z_post), _sinkhorn(z, hc_eps, ITERS, 1, 0)


@triton.jit(do_not_specialize=["T", "splits"])
def _hc_finish_row_kernel(
    part_ptr, sq_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, splits, hc_eps, norm_eps,
    ITERS: tl.constexpr, M: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Row t = program id from its chunk partials."""
    t = tl.program_id(0).to(tl.int64)
    pre, post, comb = _row_coefficients(part_ptr, sq_ptr, base_ptr, scale_ptr, t, T, K, splits, hc_eps,
                                        norm_eps, ITERS, M, SPLITS, BLOCK_N)
    i = tl.arange(0, M)
    tl.store(pre_ptr + t * M + i, pre)
    tl.store(post_ptr + t * M + i, post)
    tl.store(comb_ptr + t * (M * M) + i[:, None] * M + i[None, :], comb)


@triton.jit
def _load_mix(part_ptr, base_ptr, scale, rms, t, T, col, splits, BLOCK_N: tl.constexpr):
    """z = base + (sum of the chunk partial products, in chunk order) * rms * scale at columns `col`."""
    mix = tl.load(part_ptr + t * BLOCK_N + col, mask=t < T, other=0.0)
    for s in range(1, splits):
        mix += tl.load(part_ptr + (s * T + t) * BLOCK_N + col, mask=t < T, other=0.0)
    return tl.load(base_ptr + col) + mix * rms * scale


@triton.jit(do_not_specialize=["T"])
def _hc_finish_rows_kernel(
    part_ptr, sq_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, splits, hc_eps, norm_eps,
    ITERS: tl.constexpr, M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """BLOCK_T rows per program from their chunk partials (summed in chunk order)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    sq = tl.zeros((BLOCK_T,), tl.float32)
    for s in range(splits):
        sq += tl.load(sq_ptr + s * T + t, mask=t < T, other=0.0)
    rms = tl.rsqrt(sq / K + norm_eps)
    i = tl.arange(0, M)
    t2, i2 = t[:, None], i[None, :]
    mask2 = (t < T)[:, None]
    z_pre = _load_mix(part_ptr, base_ptr, tl.load(scale_ptr), rms[:, None], t2, T, i2, splits, BLOCK_N)
    tl.store(pre_ptr + t2 * M + i2, tl.sigmoid(z_pre) + hc_eps, mask=mask2)
    z_post = _load_mix(part_ptr, base_ptr, tl.load(scale_ptr + 1), rms[:, None], t2, T, M + i2,
                       splits, BLOCK_N)
    tl.store(post_ptr + t2 * M + i2, 2 * tl.sigmoid(z_post), mask=mask2)
    # comb logits [t, i (in), j (out)]: row softmax, then alternate column / row normalisation
    t3, i3, j3 = t[:, None, None], i[None, :, None], i[None, None, :]
    cell = i3 * M + j3
    z = _load_mix(part_ptr, base_ptr, tl.load(scale_ptr + 2), rms[:, None, None], t3, T, 2 * M + cell,
                  splits, BLOCK_N)
    c = _sinkhorn(z, hc_eps, ITERS, 2, 1)
    tl.store(comb_ptr + t3 * (M * M) + cell, c, mask=(t < T)[:, None, None])


def _check_coefficients(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                        sinkhorn_iters: int) -> None:
    m, h = streams.shape[1:]
    n_out = m * (m + 2)
    if fn.shape != (n_out, m * h) or base.shape != (n_out,) or scale.shape != (3,):
        raise ValueError(f"hc_coefficients: fn {tuple(fn.shape)}, base {tuple(base.shape)}, scale "
                         f"{tuple(scale.shape)} do not fit m={m}, H={h}")
    if m & (m - 1) or sinkhorn_iters < 1:
        raise ValueError(f"hc_coefficients needs a power-of-two m and >= 1 Sinkhorn iterations, got {m}, "
                         f"{sinkhorn_iters}")


def _split_path(streams: torch.Tensor, batch_invariant: bool) -> bool:
    """Whether the projection takes the split path (`_hc_project_split_kernel`): bf16 streams past
    _LATENCY_ROWS rows, and in batch-invariant mode at every T."""
    return streams.dtype == torch.bfloat16 and (batch_invariant or streams.shape[0] > _LATENCY_ROWS)


def _project(streams: torch.Tensor, fn: torch.Tensor, latency: bool, batch_invariant: bool
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk partials of the projection [splits, T, BLOCK_N] and of the sums of squares [splits, T] of
    T >= 1 rows, float32 fn; `latency`: the latency path's tiles and chunks, else the split path's
    (`_split_path`) or the rows path's."""
    t, m, h = streams.shape
    k, n_out = m * h, m * (m + 2)
    x = streams.reshape(t, k)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if not latency and _split_path(streams, batch_invariant):
        block_n = max(16, triton.next_power_of_2(n_out))
        parts = torch.empty(3, block_n, k, dtype=torch.bfloat16, device=x.device)
        _split_bf16x3_kernel[(block_n, triton.cdiv(k, 1024))](fn, parts, n_out, k, BLOCK_N=block_n,
                                                               BLOCK_K=1024)
        splits = triton.cdiv(k, _SPLIT_TILE["K_CHUNK"])
        part = torch.empty(splits, t, block_n, dtype=torch.float32, device=x.device)
        sq = torch.empty(splits, t, dtype=torch.float32, device=x.device)
        _hc_project_split_kernel[(triton.cdiv(t, _SPLIT_TILE["BLOCK_T"]), splits)](
            x, parts, part, sq, t, k, x.stride(0), BLOCK_N=block_n,
            ROW_SUMS=batch_invariant and not x.is_cuda, **_SPLIT_TILE)
        return part, sq
    block_t = 16 if latency or (t <= 16 and not batch_invariant) else 64
    chunk = _LATENCY_CHUNK if latency else _ROWS_CHUNK
    splits = triton.cdiv(k, chunk)
    block_n = max(16, triton.next_power_of_2(n_out))
    part = torch.empty(splits, t, block_n, dtype=torch.float32, device=x.device)
    sq = torch.empty(splits, t, dtype=torch.float32, device=x.device)
    # the rows path's 3xTF32 tile at 4 warps needs more than 255 registers a thread (ptxas for sm_90a:
    # 176 bytes spilled in the K loop); at 8 warps nothing spills
    _hc_project_kernel[(triton.cdiv(t, block_t), splits)](
        x, fn, part, sq, t, k, x.stride(0), fn.stride(0), n_out, K_CHUNK=chunk, BLOCK_T=block_t,
        BLOCK_K=_BLOCK_K, BLOCK_N=block_n, BF16_SPLIT=latency and x.dtype == torch.bfloat16,
        ROW_SUMS=batch_invariant and not x.is_cuda, num_warps=4 if latency else 8, num_stages=3,
    )
    return part, sq


def hc_coefficients(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    sinkhorn_iters: int,
    hc_eps: float,
    norm_eps: float,
    *,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, m], post [T, m], comb [T, m, m]) in float32 from streams [T, m, H]. `batch_invariant`:
    one path for any T (module docstring): its tile height, chunk size and finish fix the product's
    tensor-core instruction shape and the order of the chunk sums."""
    _check_coefficients(streams, fn, base, scale, sinkhorn_iters)
    t, m, h = streams.shape
    dev = streams.device
    fn, base, scale = fn.float().contiguous(), base.float().contiguous(), scale.float().contiguous()
    pre = torch.empty(t, m, dtype=torch.float32, device=dev)
    post = torch.empty(t, m, dtype=torch.float32, device=dev)
    comb = torch.empty(t, m, m, dtype=torch.float32, device=dev)
    if t == 0:
        return pre, post, comb
    latency = t <= _LATENCY_ROWS and not batch_invariant
    part, sq = _project(streams, fn, latency, batch_invariant)
    splits, block_n = part.shape[0], part.shape[2]
    if latency or (batch_invariant and _split_path(streams, batch_invariant)):
        _hc_finish_row_kernel[(t,)](
            part, sq, base, scale, pre, post, comb, t, m * h, splits, hc_eps, norm_eps, ITERS=sinkhorn_iters,
            M=m, SPLITS=triton.next_power_of_2(splits), BLOCK_N=block_n, num_warps=1,
        )
    else:
        rows = _SPLIT_FINISH_ROWS if _split_path(streams, batch_invariant) else 32
        _hc_finish_rows_kernel[(triton.cdiv(t, rows),)](
            part, sq, base, scale, pre, post, comb, t, m * h, splits, hc_eps, norm_eps, ITERS=sinkhorn_iters,
            M=m, BLOCK_T=rows, BLOCK_N=block_n, num_warps=4,
        )
    return pre, post, comb


@triton.jit
def _collapse_block(x_ptr, pre_ptr, t, h, mask, H, M: tl.constexpr):
    """sum_j pre[t, j] * streams[t, j, h] in float32 at columns h."""
    acc = tl.zeros(h.shape, tl.float32)
    for j in tl.static_range(M):
        x = tl.load(x_ptr + (t * M + j).to(tl.int64) * H + h, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(pre_ptr + t * M + j) * x
    return acc


@triton.jit
def _hc_collapse_kernel(x_ptr, pre_ptr, out_ptr, H, M: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = _collapse_block(x_ptr, pre_ptr, t, h, h < H, H, M)
    tl.store(out_ptr + t.to(tl.int64) * H + h, acc.to(out_ptr.dtype.element_ty), mask=h < H)


@triton.jit
def _hc_collapse_norm_kernel(
    x_ptr, pre_ptr, w_ptr, out_ptr, H, eps, M: tl.constexpr, BLOCK: tl.constexpr
):
    """One row: the collapse rounded to the output dtype (as `hc_collapse` stores it), then RMSNorm."""
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK)
    mask = h < H
    out_ty = out_ptr.dtype.element_ty
    x = _collapse_block(x_ptr, pre_ptr, t, h, mask, H, M).to(out_ty).to(tl.float32)
    y = rms_norm_values(x, tl.load(w_ptr + h, mask=mask, other=0.0).to(tl.float32), H, eps)
    tl.store(out_ptr + t.to(tl.int64) * H + h, y.to(out_ty), mask=mask)


@triton.jit
def _expand_block(y_ptr, x_ptr, out_ptr, post, comb, t, h, mask, H, M: tl.constexpr):
    """New streams of row t at columns h: R'[k] = post[k] * y + sum_j comb[j, k] * R[j], from post [M]
    and comb [M (in), M (out)] in registers."""
    j = tl.arange(0, M)
    y = tl.load(y_ptr + t.to(tl.int64) * H + h, mask=mask, other=0.0).to(tl.float32)
    rows = (t * M + j[:, None]).to(tl.int64) * H + h[None, :]
    x = tl.load(x_ptr + rows, mask=mask[None, :], other=0.0).to(tl.float32)  # [M (in), BLOCK_H]
    for k in tl.static_range(M):
        c = tl.sum(tl.where(j[None, :] == k, comb, 0.0), axis=1)  # comb[:, k]
        mixed = tl.sum(c[:, None] * x, axis=0)
        out = tl.sum(tl.where(j == k, post, 0.0), axis=0) * y + mixed
        tl.store(out_ptr + (t * M + k).to(tl.int64) * H + h, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _hc_expand_kernel(
    y_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, H, M: tl.constexpr, BLOCK_H: tl.constexpr
):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, M)
    post = tl.load(post_ptr + t * M + i)
    comb = tl.load(comb_ptr + t * M * M + i[:, None] * M + i[None, :])
    _expand_block(y_ptr, x_ptr, out_ptr, post, comb, t, h, h < H, H, M)


@triton.jit(do_not_specialize=["T", "splits"])
def _hc_residual_kernel(
    y_ptr, x_ptr, part_ptr, sq_ptr, base_ptr, scale_ptr, pre_ptr, out_ptr, T, K, H, splits, hc_eps, norm_eps,
    ITERS: tl.constexpr, M: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """`_hc_expand_kernel` whose programs each finish their row's coefficients from the projection's
    chunk partials (the same values in every program of the row; the first one stores pre)."""
    t = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    pre, post, comb = _row_coefficients(part_ptr, sq_ptr, base_ptr, scale_ptr, t, T, K, splits, hc_eps,
                                        norm_eps, ITERS, M, SPLITS, BLOCK_N)
    if pid_h == 0:
        tl.store(pre_ptr + t * M + tl.arange(0, M), pre)
    h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    _expand_block(y_ptr, x_ptr, out_ptr, post, comb, t, h, h < H, H, M)


def _block_h(h: int) -> int:
    return min(1024, triton.next_power_of_2(h))


def hc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Weighted sum of the streams [T, m, H] with pre [T, m] (FP32 accumulation) -> [T, H]."""
    t, m, h = streams.shape
    streams, pre = streams.contiguous(), pre.float().contiguous()
    out = torch.empty(t, h, dtype=streams.dtype, device=streams.device)
    if out.numel():
        _hc_collapse_kernel[(t, triton.cdiv(h, _block_h(h)))](streams, pre, out, h, M=m, BLOCK_H=_block_h(h))
    return out


def hc_collapse_norm(streams: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, eps: float
                     ) -> torch.Tensor:
    """rms_norm(hc_collapse(streams, pre), weight, eps) in one program per row, bitwise as the two ops
    (the collapse rounded to the streams' dtype, norm.py's reduction tree) -> [T, H]."""
    t, m, h = streams.shape
    if weight.shape != (h,):
        raise ValueError(f"hc_collapse_norm: weight {tuple(weight.shape)} does not fit H={h}")
    streams, pre, weight = streams.contiguous(), pre.float().contiguous(), weight.contiguous()
    out = torch.empty(t, h, dtype=streams.dtype, device=streams.device)
    block = triton.next_power_of_2(h)
    if out.numel():
        _hc_collapse_norm_kernel[(t,)](streams, pre, weight, out, h, eps, M=m, BLOCK=block,
                                       num_warps=row_warps(block))
    return out


def hc_expand(
    output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """New streams: R'[k] = post[k] * y + sum_j comb[j, k] * R[j], in the output's dtype."""
    t, m, h = streams.shape
    if m & (m - 1):
        raise ValueError(f"hc_expand needs a power-of-two stream count, got {m}")
    output, streams = output.contiguous(), streams.contiguous()
    post, comb = post.float().contiguous(), comb.float().contiguous()
    out = torch.empty(t, m, h, dtype=output.dtype, device=output.device)
    if out.numel():
        _hc_expand_kernel[(t, triton.cdiv(h, _block_h(h)))](
            output, streams, post, comb, out, h, M=m, BLOCK_H=_block_h(h)
        )
    return out


def hc_residual(
    output: torch.Tensor,
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    sinkhorn_iters: int,
    hc_eps: float,
    norm_eps: float,
    *,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(new streams [T, m, H], pre [T, m]): `hc_expand` of the sub-layer output with the coefficients
    `hc_coefficients` computes from the streams entering the sub-layer. On the latency path the
    expansion's programs finish their row's coefficients from the projection partials themselves: two
    launches instead of three (the rows path and invariant mode: the two ops as they are)."""
    t, m, h = streams.shape
    if batch_invariant or not 0 < t <= _LATENCY_ROWS:
        pre, post, comb = hc_coefficients(streams, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps,
                                          batch_invariant=batch_invariant)
        return hc_expand(output, streams, post, comb), pre
    _check_coefficients(streams, fn, base, scale, sinkhorn_iters)
    if output.shape != (t, h):
        raise ValueError(f"hc_residual: output {tuple(output.shape)} does not fit streams "
                         f"{tuple(streams.shape)}")
    output, streams = output.contiguous(), streams.contiguous()
    fn, base, scale = fn.float().contiguous(), base.float().contiguous(), scale.float().contiguous()
    part, sq = _project(streams, fn, True, False)
    splits, block_n = part.shape[0], part.shape[2]
    pre = torch.empty(t, m, dtype=torch.float32, device=streams.device)
    out = torch.empty(t, m, h, dtype=output.dtype, device=output.device)
    block_h = min(_RESIDUAL_BLOCK_H, triton.next_power_of_2(h))
    _hc_residual_kernel[(t, triton.cdiv(h, block_h))](
        output, streams, part, sq, base, scale, pre, out, t, m * h, h, splits, hc_eps, norm_eps,
        ITERS=sinkhorn_iters, M=m, SPLITS=triton.next_power_of_2(splits), BLOCK_N=block_n, BLOCK_H=block_h,
        num_warps=_RESIDUAL_WARPS,
    )
    return out, pre
