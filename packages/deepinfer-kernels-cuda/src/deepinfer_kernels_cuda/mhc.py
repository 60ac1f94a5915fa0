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
* rows (T > 64, and batch-invariant mode at every T): 3xTF32 in 64-row tiles (16 at T <= 16 outside
  invariant mode) over 512-column chunks, finish programs of 32 rows summing the chunks in order.
  T=2048 160 us (the latency path's kernels at that size, even with 64-row tiles and 512-column chunks:
  587 us).
`batch_invariant` keeps the rows path with 64-row tiles at every T, so a row's bits do not depend on T.
"""

import torch
import triton
import triton.language as tl

_BLOCK_K = 128
_LATENCY_CHUNK = 256  # projection columns per program on the latency path
_ROWS_CHUNK = 512  # ... on the rows path (40 programs a row block at Flash)
_LATENCY_ROWS = 64  # default mode up to this many rows: the latency path


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
):
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
        else:
            acc = tl.dot(xf, w, acc, input_precision="tf32x3")
    base = split.to(tl.int64) * T + t
    tl.store(part_ptr + base[:, None] * BLOCK_N + j[None, :], acc, mask=(t < T)[:, None])
    tl.store(sq_ptr + base, sq, mask=t < T)


@triton.jit(do_not_specialize=["T", "splits"])
def _hc_finish_row_kernel(
    part_ptr, sq_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, splits, hc_eps, norm_eps,
    ITERS: tl.constexpr, M: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Row t = program id from its chunk partials: RMS factor, sigmoids, Sinkhorn."""
    t = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SPLITS)
    live = s < splits
    rms = tl.rsqrt(tl.sum(tl.load(sq_ptr + s * T + t, mask=live, other=0.0), axis=0) / K + norm_eps)
    rows = (s * T + t) * BLOCK_N
    i = tl.arange(0, M)
    z_pre = tl.load(base_ptr + i) + _chunk_sum(
        part_ptr, rows[:, None], live[:, None], i[None, :], rms * tl.load(scale_ptr))
    tl.store(pre_ptr + t * M + i, tl.sigmoid(z_pre) + hc_eps)
    z_post = tl.load(base_ptr + M + i) + _chunk_sum(
        part_ptr, rows[:, None], live[:, None], M + i[None, :], rms * tl.load(scale_ptr + 1))
    tl.store(post_ptr + t * M + i, 2 * tl.sigmoid(z_post))
    # comb logits [i (in), j (out)]: row softmax, then alternate column / row normalisation
    cell = i[:, None] * M + i[None, :]
    z = tl.load(base_ptr + 2 * M + cell) + _chunk_sum(
        part_ptr, rows[:, None, None], live[:, None, None], 2 * M + cell[None, :, :],
        rms * tl.load(scale_ptr + 2))
    c = _sinkhorn(z, hc_eps, ITERS, 1, 0)
    tl.store(comb_ptr + t * (M * M) + cell, c)


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
    one tile height and one chunk size for any T (the product's tensor-core instruction shape and the
    order of the chunk sums follow them)."""
    t, m, h = streams.shape
    k, n_out = m * h, m * (m + 2)
    if fn.shape != (n_out, k) or base.shape != (n_out,) or scale.shape != (3,):
        raise ValueError(f"hc_coefficients: fn {tuple(fn.shape)}, base {tuple(base.shape)}, scale "
                         f"{tuple(scale.shape)} do not fit m={m}, H={h}")
    if m & (m - 1) or sinkhorn_iters < 1:
        raise ValueError(f"hc_coefficients needs a power-of-two m and >= 1 Sinkhorn iterations, got {m}, "
                         f"{sinkhorn_iters}")
    dev = streams.device
    x = streams.reshape(t, k)
    if x.stride(-1) != 1:
        x = x.contiguous()
    fn, base, scale = fn.float().contiguous(), base.float().contiguous(), scale.float().contiguous()
    pre = torch.empty(t, m, dtype=torch.float32, device=dev)
    post = torch.empty(t, m, dtype=torch.float32, device=dev)
    comb = torch.empty(t, m, m, dtype=torch.float32, device=dev)
    if t == 0:
        return pre, post, comb
    latency = t <= _LATENCY_ROWS and not batch_invariant
    block_t = 16 if latency or (t <= 16 and not batch_invariant) else 64
    chunk = _LATENCY_CHUNK if latency else _ROWS_CHUNK
    splits = triton.cdiv(k, chunk)
    block_n = max(16, triton.next_power_of_2(n_out))
    part = torch.empty(splits, t, block_n, dtype=torch.float32, device=dev)
    sq = torch.empty(splits, t, dtype=torch.float32, device=dev)
    _hc_project_kernel[(triton.cdiv(t, block_t), splits)](
        x, fn, part, sq, t, k, x.stride(0), fn.stride(0), n_out, K_CHUNK=chunk, BLOCK_T=block_t,
        BLOCK_K=_BLOCK_K, BLOCK_N=block_n, BF16_SPLIT=latency and x.dtype == torch.bfloat16, num_warps=4,
        num_stages=3,
    )
    if latency:
        _hc_finish_row_kernel[(t,)](
            part, sq, base, scale, pre, post, comb, t, k, splits, hc_eps, norm_eps, ITERS=sinkhorn_iters,
            M=m, SPLITS=triton.next_power_of_2(splits), BLOCK_N=block_n, num_warps=1,
        )
    else:
        _hc_finish_rows_kernel[(triton.cdiv(t, 32),)](
            part, sq, base, scale, pre, post, comb, t, k, splits, hc_eps, norm_eps, ITERS=sinkhorn_iters,
            M=m, BLOCK_T=32, BLOCK_N=block_n, num_warps=4,
        )
    return pre, post, comb


@triton.jit
def _hc_collapse_kernel(x_ptr, pre_ptr, out_ptr, H, M: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), tl.float32)
    for j in tl.static_range(M):
        x = tl.load(x_ptr + (t * M + j).to(tl.int64) * H + h, mask=h < H, other=0.0).to(tl.float32)
        acc += tl.load(pre_ptr + t * M + j) * x
    tl.store(out_ptr + t.to(tl.int64) * H + h, acc.to(out_ptr.dtype.element_ty), mask=h < H)


@triton.jit
def _hc_expand_kernel(
    y_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, H, M: tl.constexpr, BLOCK_H: tl.constexpr
):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, M)
    mask = h < H
    y = tl.load(y_ptr + t.to(tl.int64) * H + h, mask=mask, other=0.0).to(tl.float32)
    rows = (t * M + j[:, None]).to(tl.int64) * H + h[None, :]
    x = tl.load(x_ptr + rows, mask=mask[None, :], other=0.0).to(tl.float32)  # [M (in), BLOCK_H]
    for k in tl.static_range(M):
        c = tl.load(comb_ptr + t * M * M + j * M + k)  # comb[t, :, k]
        mixed = tl.sum(c[:, None] * x, axis=0)
        out = tl.load(post_ptr + t * M + k) * y + mixed
        tl.store(out_ptr + (t * M + k).to(tl.int64) * H + h, out.to(out_ptr.dtype.element_ty), mask=mask)


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
