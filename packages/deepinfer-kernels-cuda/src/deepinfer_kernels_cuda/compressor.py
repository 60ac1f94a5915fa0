"""Compressor update (op `compressor_update`): softmax-gated pooling of the groups a step completes,
then the compressor ring update, for all new tokens of a layer.

Two launches, in this order: the pooling kernel reads the groups' rows (ring rows and this step's
rows) and the ring update writes `gate_value[state_src]` at `state_dest`. They cannot share a launch:
a chunk longer than the ring's backtrack may overwrite a ring row that one of its own groups still
reads, and programs of one launch run in no fixed order.

Numerics are those of the reference on the same device: max, exp (libdevice's expf, as torch's CUDA
kernels; numpy's exp under the interpreter), a float32 sum of the exps in ratio order (the sum of
2^k terms is a pairwise tree, equal to torch's for ratio 2), a correctly rounded division, the
products rounded before they are summed (no FMA contraction). Row-wise: a group's result depends only
on its own rows and the tile config only on the width, so it never depends on the batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from deepinfer.cache.codecs import Codec
from deepinfer_kernels_cuda.cache_quant import write_rows

_GROUPS = 4  # completed groups per program
_BLOCK_D = 128  # channels per program


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        y = libdevice.exp(x)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _group_rows(gv_ptr, state_ptr, step_off, ring_off, current, mask, cols):
    """Columns `cols` of the group rows [GROUPS, RATIO_P2]: step rows where `current`, else ring rows."""
    now = current[:, :, None]
    from_step = tl.load(gv_ptr + step_off[:, :, None] + cols, mask=mask & now, other=0.0)
    from_ring = tl.load(state_ptr + ring_off[:, :, None] + cols, mask=mask & ~now, other=0.0)
    return tl.where(now, from_step, from_ring)


# row counts are not specialised (== 1, multiple of 16): a new batch size compiles no new kernel
@triton.jit(do_not_specialize=["M", "T"])
def _pool_kernel(
    gv_ptr, state_ptr, src_ptr, out_ptr, M, T, D, ring_rows, ring_len, stride_gv, stride0, stride1,
    RATIO: tl.constexpr, RATIO_P2: tl.constexpr, GROUPS: tl.constexpr, BLOCK_D: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """pooled[m, c] = sum_i softmax_i(gate[m, i, c]) * value[m, i, c] for GROUPS groups x BLOCK_D
    channels; row r of a group: r < ring_rows a ring row, else step row r - ring_rows (both clamped)."""
    m = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    i = tl.arange(0, RATIO_P2)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    live = (m < M)[:, None] & (i < RATIO)[None, :]  # [GROUPS, RATIO_P2]
    src = tl.load(src_ptr + m[:, None] * RATIO + i[None, :], mask=live, other=0)
    current = src >= ring_rows
    ring_row = tl.minimum(tl.maximum(src, 0), ring_rows - 1)
    ring_off = (ring_row // ring_len) * stride0 + (ring_row % ring_len) * stride1
    step_off = tl.minimum(tl.maximum(src - ring_rows, 0), T - 1) * stride_gv
    mask = live[:, :, None] & (c < D)[None, None, :]
    gate = _group_rows(gv_ptr, state_ptr, step_off, ring_off, current, mask, c[None, None, :])
    value = _group_rows(gv_ptr, state_ptr, step_off, ring_off, current, mask, D + c[None, None, :])
    gate = tl.where((i < RATIO)[None, :, None], gate, -float("inf"))  # padded ratio slots weigh exactly 0
    e = _exp(gate - tl.max(gate, axis=1)[:, None, :], LIBDEVICE)
    p = tl.math.div_rn(e, tl.sum(e, axis=1)[:, None, :])
    pooled = tl.sum(value * p, axis=1)
    out_mask = (m < M)[:, None] & (c < D)[None, :]
    tl.store(out_ptr + m[:, None].to(tl.int64) * D + c[None, :], pooled, mask=out_mask)


def compressor_update(
    gate_value: torch.Tensor,
    state: torch.Tensor,
    sources: torch.Tensor,
    state_dest: torch.Tensor,
    state_src: torch.Tensor,
) -> torch.Tensor:
    """Softmax-gated pooling of the groups completed in this step, then the state ring update.

    gate_value [T, 2D] float32 (gate scores, values); state [S, Lc, 2D * 4] uint8, the raw float32
    compressor ring (position p of slot s at ring row s * Lc + p % Lc); sources [M, ratio] long, rows
    of each completed group in position order (r < S * Lc ring row r, else step row r - S * Lc).
    Returns pooled [M, D] float32; afterwards state[state_dest] = gate_value[state_src].
    """
    if gate_value.dtype != torch.float32 or gate_value.dim() != 2 or gate_value.shape[1] % 2:
        raise ValueError(f"gate_value must be float32 [T, 2D], got {gate_value.dtype} "
                         f"{tuple(gate_value.shape)}")
    width = gate_value.shape[1]
    if state.dtype != torch.uint8 or state.dim() != 3 or state.shape[2] != width * 4:
        raise ValueError(f"state must be uint8 [S, Lc, {width * 4}], got {state.dtype} {tuple(state.shape)}")
    if sources.dim() != 2:
        raise ValueError(f"sources must be [M, ratio], got {tuple(sources.shape)}")
    d, (groups, ratio) = width // 2, sources.shape
    gate_value = gate_value if gate_value.stride(1) == 1 else gate_value.contiguous()
    ring = state.view(torch.float32)
    pooled = torch.empty(groups, d, dtype=torch.float32, device=gate_value.device)
    if groups:
        grid = (triton.cdiv(groups, _GROUPS), triton.cdiv(d, _BLOCK_D))
        _pool_kernel[grid](
            gate_value, ring, sources.contiguous(), pooled, groups, gate_value.shape[0], d,
            state.shape[0] * state.shape[1], state.shape[1], gate_value.stride(0), ring.stride(0),
            ring.stride(1), RATIO=ratio, RATIO_P2=triton.next_power_of_2(ratio), GROUPS=_GROUPS,
            BLOCK_D=_BLOCK_D, LIBDEVICE=gate_value.is_cuda, enable_fp_fusion=False,
        )
    write_rows(state, state_dest, gate_value, Codec("raw", width, torch.float32), src=state_src)
    return pooled
