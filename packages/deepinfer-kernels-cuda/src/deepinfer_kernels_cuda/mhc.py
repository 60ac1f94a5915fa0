"""mHC: fused coefficients (projection, RMS factor, sigmoids, Sinkhorn), collapse and expansion.

`hc_coefficients` is a skinny product [T, m*H] x [m*H, m(m+2)] (K = 20480, N = 24 at Flash width):
the first kernel splits K into fixed-size chunks (the split count depends on K only) and writes float32
partial products and sums of squares; the second sums the chunks in order and finishes each row in
registers: RMS factor, pre/post sigmoids and the 20 Sinkhorn iterations on the m x m matrix. The product
runs on tensor cores in 3xTF32, which is float32-accurate (the reference is a float32 matmul). Its tile
height follows T (16 rows up to 16, else 64) and the tensor-core instruction shape with it, so a row's
last bits can change with the batch size; `batch_invariant` keeps 64 rows at every T.
"""

import torch
import triton
import triton.language as tl

_K_CHUNK = 512  # columns of the projection per program in the first kernel (40 programs a row block at Flash)
_BLOCK_K = 128


# row counts are not specialised (== 1, multiple of 16): a new batch size compiles no new kernel
@triton.jit(do_not_specialize=["T"])
def _hc_project_kernel(
    x_ptr, fn_ptr, part_ptr, sq_ptr, T, K, x_stride, fn_stride, n_out,
    K_CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_t, split = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    sq = tl.zeros((BLOCK_T,), tl.float32)
    for k0 in range(split * K_CHUNK, tl.minimum(split * K_CHUNK + K_CHUNK, K), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + t[:, None].to(tl.int64) * x_stride + k[None, :],
                    mask=(t < T)[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
        w = tl.load(fn_ptr + j[:, None] * fn_stride + k[None, :],
                    mask=(j < n_out)[:, None] & (k < K)[None, :], other=0.0)
        sq += tl.sum(x * x, axis=1)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="tf32x3")
    base = split.to(tl.int64) * T + t
    tl.store(part_ptr + base[:, None] * BLOCK_N + j[None, :], acc, mask=(t < T)[:, None])
    tl.store(sq_ptr + base, sq, mask=t < T)


@triton.jit
def _load_mix(part_ptr, base_ptr, scale, rms, t, T, col, splits, BLOCK_N: tl.constexpr):
    """z = base + (sum of the split partial products, in split order) * rms * scale at columns `col`."""
    mix = tl.load(part_ptr + t * BLOCK_N + col, mask=t < T, other=0.0)
    for s in range(1, splits):
        mix += tl.load(part_ptr + (s * T + t) * BLOCK_N + col, mask=t < T, other=0.0)
    return tl.load(base_ptr + col) + mix * rms * scale


@triton.jit(do_not_specialize=["T"])
def _hc_finish_kernel(
    part_ptr, sq_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, splits, hc_eps, norm_eps,
    ITERS: tl.constexpr, M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
):
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
    e = tl.exp(z - tl.max(z, axis=2, keep_dims=True))
    c = e / tl.sum(e, axis=2, keep_dims=True) + hc_eps
    c = c / (tl.sum(c, axis=1, keep_dims=True) + hc_eps)
    for _ in tl.static_range(ITERS - 1):
        c = c / (tl.sum(c, axis=2, keep_dims=True) + hc_eps)
        c = c / (tl.sum(c, axis=1, keep_dims=True) + hc_eps)
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
    one tile height for any T (the product's tensor-core instruction shape follows it)."""
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
    splits = triton.cdiv(k, _K_CHUNK)
    block_n = max(16, triton.next_power_of_2(n_out))
    part = torch.empty(splits, t, block_n, dtype=torch.float32, device=dev)
    sq = torch.empty(splits, t, dtype=torch.float32, device=dev)
    block_t = 16 if t <= 16 and not batch_invariant else 64
    _hc_project_kernel[(triton.cdiv(t, block_t), splits)](
        x, fn, part, sq, t, k, x.stride(0), fn.stride(0), n_out,
        K_CHUNK=_K_CHUNK, BLOCK_T=block_t, BLOCK_K=_BLOCK_K, BLOCK_N=block_n, num_warps=4, num_stages=3,
    )
    _hc_finish_kernel[(triton.cdiv(t, 32),)](
        part, sq, base, scale, pre, post, comb, t, k, splits, hc_eps, norm_eps,
        ITERS=sinkhorn_iters, M=m, BLOCK_T=32, BLOCK_N=block_n, num_warps=4,
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
