"""The MoE sub-layer as a fixed sequence of launches with no host sync:

1. router logits (float32, cuBLAS) and a routing kernel: sqrt(softplus), selection bias (bias_vl for
   image rows), top-k, normalisation and routed scaling, one program per token;
2. alignment (torch ops on the device): assignments sorted by expert into a padded layout whose size
   depends only on (tokens, top-k, experts, block_m), so launch grids never wait on the device;
3. FP4 grouped gate+up GEMM with the clamped SwiGLU and the routing weight in its epilogue;
4. FP4 grouped down GEMM writing one row per (token, slot);
5. the shared expert (block-scaled linears; on a second stream beside 1-4, `SHARED_STREAM`) and a
   combine kernel summing each token's slots in float32.

Decode (at most DECODE_ASSIGNMENTS token-slot assignments) skips the alignment: one program per
(assignment, weight tile), on the CUDA cores (GEMVs) or the MMA kernels with one live token column, as
the table's decode tile says (configs.lookup_moe_decode). Where the table also holds a down tile
(configs.lookup_moe_decode_down; H200: yes) the decode path is fused, 3 launches per layer: the router
GEMV (`_router_gemv_kernel` up to ROUTER_GEMV_TOKENS tokens, else cuBLAS), one gate+up launch whose
programs route their token themselves and in which the FP8 shared expert is one more assignment, and one
down launch that also sums each token's slots and shared expert (per-token programs, or with the down
tile's split_k > 1 one program per slot and the last to arrive combining). Else the unfused decode path:
routing, gate+up, down, the shared expert's gate+up GEMV and down linear, combine (8 launches).

Batch-invariant mode (`batch_invariant=True`) trades that size-dependent choice for one fixed path: a
fixed-tile router GEMM instead of cuBLAS, the grouped kernels with INVARIANT_CONFIG's MMA chain per output
at every size (its tiles, or at prefill sizes larger ones with the same chain: `invariant_tiles`; never the
GEMVs), and the FP8 shared expert as a one-expert MLP through the same kernels.

Each GEMM program owns one expert block of tokens and one tile of weight rows, and programs of inactive
blocks exit at once, so decode reads only the touched experts' bytes. Rounding points follow the
reference (models/deepseek_v41/moe.py): gate/up products rounded to x's dtype before the SwiGLU, the
weighted activation rounded before w2, each expert's w2 output rounded before the float32 sum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from deepinfer.checkpoint.formats import E2M1_VALUES, pack_fp4, unpack_fp4_codes
from deepinfer_kernels_cuda import configs
from deepinfer_kernels_cuda.dequant import (
    ASM_MAX_SCALE,
    GROUP,
    GROUP_TL,
    fp4_gemv_products,
    fp4_split_decode,
    fp4_split_tile,
    fp8_tile,
    pow2,
    split_columns,
)
from deepinfer_kernels_cuda.linear import PreparedLinear, dot_acc, linear, mm_out


@dataclass(frozen=True)
class PreparedExperts:
    """Stacked routed experts, contiguous, UE8M0 scales as uint8: packed FP4 as uint8 in the split layout
    (`split_nibbles`), or with `fp8` each E2M1 value re-encoded as E4M3 (exact: E2M1 is a subset of
    E4M3), twice the bytes for a cheaper decode. `asm`: FP4 kernels decode through the packed BF16x2
    PTX (`dequant.e2m1_pair_bf16_asm`) instead of Triton integer ops (same values)."""

    w1: torch.Tensor  # [E, I, H/2] (FP4) | [E, I, H] (FP8)
    s1: torch.Tensor  # [E, I, H/32]
    w3: torch.Tensor
    s3: torch.Tensor
    w2: torch.Tensor  # [E, H, I/2] | [E, H, I]
    s2: torch.Tensor  # [E, H, I/32]
    fp8: bool = False
    asm: bool = False

    @property
    def n_experts(self) -> int:
        return self.w1.shape[0]

    @property
    def inter(self) -> int:
        return self.w1.shape[1]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]


def _stack(t: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    return (torch.stack(list(t)) if isinstance(t, (list, tuple)) else t).contiguous().view(torch.uint8)


def split_nibbles(packed: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """Release packing (byte c holds columns 2c, 2c + 1) -> split layout: in each 32-column group, byte j
    holds columns j (low nibble) and j + 16 (high). A kernel then decodes the low and high nibbles of a
    tile as two contiguous column runs that share one scale, with no interleave. `chunk` experts at a
    time bound the temporary memory."""
    out = torch.empty_like(packed)
    for e in range(0, packed.shape[0], chunk):
        groups = unpack_fp4_codes(packed[e:e + chunk]).unflatten(-1, (-1, 2, 16))  # [.., group, half, j]
        out[e:e + chunk] = pack_fp4(groups.transpose(-1, -2).flatten(-3)).view(torch.uint8)
    return out


def e2m1_to_e4m3(packed: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """Release-packed FP4 [E, N, K/2] -> E4M3 [E, N, K], value for value (exact: E2M1 is within E4M3)."""
    table = torch.tensor(E2M1_VALUES).to(torch.float8_e4m3fn).view(torch.uint8).to(packed.device)
    out = torch.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.uint8, device=packed.device)
    for e in range(0, packed.shape[0], chunk):
        out[e:e + chunk] = table[unpack_fp4_codes(packed[e:e + chunk]).long()]
    return out.view(torch.float8_e4m3fn)


def asm_decodable(p: PreparedExperts) -> bool:
    """Whether the packed PTX decode serves these experts: split FP4 on a GPU, every scale byte within
    ASM_MAX_SCALE (one device reduction, at load)."""
    if p.fp8 or not p.w1.is_cuda:
        return False
    return all(int(s.max()) <= ASM_MAX_SCALE for s in (p.s1, p.s3, p.s2) if s.numel())


def prepare_experts(w1, w1_scale, w3, w3_scale, w2, w2_scale, fp8: bool = False,
                    asm: bool | None = None) -> PreparedExperts:
    """Stack (lists of [I, H/2] or stacked [E, ...]) packed FP4 experts into the kernels' layout (FP4
    split, or E4M3 with `fp8`). `asm`: the packed PTX decode for FP4 (None: wherever `asm_decodable`)."""
    p = PreparedExperts(*(_stack(t) for t in (w1, w1_scale, w3, w3_scale, w2, w2_scale)))
    e, i, h = p.n_experts, p.inter, p.hidden
    want = {"w1": (e, i, h // 2), "w1_scale": (e, i, h // GROUP), "w3": (e, i, h // 2),
            "w3_scale": (e, i, h // GROUP), "w2": (e, h, i // 2), "w2_scale": (e, h, i // GROUP)}
    got = {"w1": p.w1, "w1_scale": p.s1, "w3": p.w3, "w3_scale": p.s3, "w2": p.w2, "w2_scale": p.s2}
    for name, shape in want.items():
        if tuple(got[name].shape) != shape:
            raise ValueError(f"experts {name}: shape {tuple(got[name].shape)}, expected {shape}")
    if h % GROUP or i % GROUP:
        raise ValueError(f"experts hidden {h} / intermediate {i}: must be multiples of {GROUP}")
    convert = e2m1_to_e4m3 if fp8 else split_nibbles
    p = replace(p, w1=convert(p.w1), w3=convert(p.w3), w2=convert(p.w2), fp8=fp8)
    if asm and not asm_decodable(p):
        raise ValueError("experts: the packed decode needs split FP4 experts on a GPU with scale bytes "
                         f"<= {ASM_MAX_SCALE}")
    return replace(p, asm=asm_decodable(p) if asm is None else asm)


# --- routing


@triton.jit
def _route_token(
    logits_ptr, bias_ptr, bias_vl_ptr, mask_ptr, t, E, route_scale,
    HAS_MASK: tl.constexpr, TOPK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Token t's (weights, expert ids) [BLOCK_K] (slots past TOPK: 0) from its float32 logits."""
    e = tl.arange(0, BLOCK_E)
    valid = e < E
    logit = tl.load(logits_ptr + t * E + e, mask=valid, other=0.0)
    # softplus as torch computes it (log1p(exp(x)), x itself above 20), then sqrt; log1p(y) through
    # log(1 + y) corrected by the rounding of 1 + y, which keeps tiny exp(x) from vanishing
    y = tl.exp(logit)
    u = 1.0 + y
    log1p = tl.where(u == 1.0, y, tl.log(u) - ((u - 1.0) - y) / u)
    scores = tl.sqrt(tl.where(logit > 20.0, logit, log1p))
    bias = tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
    if HAS_MASK:
        bias_vl = tl.load(bias_vl_ptr + e, mask=valid, other=0.0).to(tl.float32)
        bias = tl.where(tl.load(mask_ptr + t) != 0, bias_vl, bias)
    sel = scores + bias
    # NaN ranks above every number (torch.topk's order): a NaN row picks valid experts and gets NaN
    # weights, where `sel == best` would match nothing and pick id BLOCK_E, past the experts
    sel = tl.where(valid, tl.where(sel != sel, float("inf"), sel), float("-inf"))
    slot = tl.arange(0, BLOCK_K)
    picked_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    picked_id = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for j in tl.static_range(TOPK):
        best = tl.max(sel, axis=0)
        idx = tl.min(tl.where(sel == best, e, BLOCK_E), axis=0)  # lowest expert id on a tie
        w = tl.sum(tl.where(e == idx, scores, 0.0), axis=0)
        picked_w = tl.where(slot == j, w, picked_w)
        picked_id = tl.where(slot == j, idx, picked_id)
        sel = tl.where(e == idx, float("-inf"), sel)
    return picked_w / (tl.sum(picked_w, axis=0) + 1e-20) * route_scale, picked_id


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, bias_vl_ptr, mask_ptr, w_out_ptr, id_out_ptr,
    E, route_scale,
    HAS_MASK: tl.constexpr, TOPK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0)
    picked_w, picked_id = _route_token(logits_ptr, bias_ptr, bias_vl_ptr, mask_ptr, t, E, route_scale,
                                       HAS_MASK, TOPK, BLOCK_E, BLOCK_K)
    slot = tl.arange(0, BLOCK_K)
    keep = slot < TOPK
    tl.store(w_out_ptr + t * TOPK + slot, picked_w, mask=keep)
    tl.store(id_out_ptr + t * TOPK + slot, picked_id, mask=keep)


def route(
    logits: torch.Tensor, bias: torch.Tensor, bias_vl: torch.Tensor, image_mask: torch.Tensor | None,
    topk: int, route_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] float32 -> (weights [T, k] float32, expert ids [T, k] int32)."""
    t, e = logits.shape
    weights = torch.empty((t, topk), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, topk), dtype=torch.int32, device=logits.device)
    if t == 0:
        return weights, ids
    mask = image_mask if image_mask is not None else ids  # any pointer when unused
    _route_kernel[(t,)](
        logits.contiguous(), bias, bias_vl, mask, weights, ids, e, float(route_scale),
        HAS_MASK=image_mask is not None, TOPK=topk, BLOCK_E=triton.next_power_of_2(e),
        BLOCK_K=triton.next_power_of_2(topk), num_warps=4,
    )
    return weights, ids


# --- alignment


@dataclass(frozen=True)
class Alignment:
    row_assign: torch.Tensor  # [blocks * block_m] int32: flat assignment (token * k + slot) or -1
    block_expert: torch.Tensor  # [blocks] int32: the expert of each block of rows, -1 past the end
    block_m: int

    @property
    def blocks(self) -> int:
        return self.block_expert.shape[0]


# assignments up to which one program aligns them (decode: one launch instead of ~10 torch ops); its
# [experts x assignments] compare matrices grow with the count, and so does the compile time
SMALL_ALIGN = 64


@triton.jit
def _align_small_kernel(
    ids_ptr, row_assign_ptr, block_expert_ptr, A, E, rows, blocks,
    BM: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    a = tl.arange(0, BLOCK_A)
    e = tl.arange(0, BLOCK_E)
    ids = tl.load(ids_ptr + a, mask=a < A, other=-1)
    hit = ids[None, :] == e[:, None]  # [experts, assignments]
    padded = (tl.sum(hit.to(tl.int32), axis=1) + BM - 1) // BM * BM
    padded_end = tl.cumsum(padded, axis=0)
    start = tl.sum(tl.where(hit, (padded_end - padded)[:, None], 0), axis=0)  # each assignment's expert
    # stable rank among the same expert's assignments
    rank = tl.sum(((ids[None, :] == ids[:, None]) & (a[None, :] < a[:, None])).to(tl.int32), axis=1)
    r = tl.arange(0, BLOCK_R)
    tl.store(row_assign_ptr + r, tl.full((BLOCK_R,), -1, tl.int32), mask=r < rows)
    tl.debug_barrier()  # the padding fill lands before the rows (one program)
    tl.store(row_assign_ptr + start + rank, a, mask=a < A)
    b = tl.arange(0, BLOCK_B)
    before = (padded_end[None, :] <= (b * BM)[:, None]) & (e[None, :] < E)  # experts ending before block b
    expert = tl.sum(before.to(tl.int32), axis=1)
    tl.store(block_expert_ptr + b, tl.where(expert < E, expert, -1), mask=b < blocks)


# above SMALL_ALIGN: two launches (`_align_count_kernel`, `_align_place_kernel`) instead of ~30 torch ops
# (eager prefill paid them in host launches while the GPU waited); False: the torch ops (tests compare)
ALIGN_KERNELS = True
_ALIGN_CHUNK = 1024  # assignments (or rows, blocks) per step of the alignment kernels' loops


@triton.jit
def _align_count_kernel(ids_ptr, counts_ptr, A, CHUNK: tl.constexpr):
    """counts[e] = assignments of expert e = program_id(0) (each program scans every assignment)."""
    e = tl.program_id(0)
    n = tl.zeros((CHUNK,), dtype=tl.int32)
    for a0 in range(0, A, CHUNK):
        a = a0 + tl.arange(0, CHUNK)
        n += (tl.load(ids_ptr + a, mask=a < A, other=-1) == e).to(tl.int32)
    tl.store(counts_ptr + e, tl.sum(n, axis=0))


@triton.jit
def _align_place_kernel(ids_ptr, counts_ptr, row_assign_ptr, block_expert_ptr, A, E, rows, blocks,
                        BM: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """Program e < E: expert e's assignments in (token, slot) order at its padded rows (the experts'
    padded counts in expert order), its padding rows -1, its blocks' expert e. Program E: the rows and
    blocks past the last expert's, -1. The layout `align`'s torch ops build."""
    e = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    counts = tl.load(counts_ptr + offs_e, mask=offs_e < E, other=0)
    padded = (counts + BM - 1) // BM * BM
    start = tl.sum(tl.where(offs_e < e, padded, 0), axis=0)
    c = tl.arange(0, CHUNK)
    if e < E:
        count = tl.sum(tl.where(offs_e == e, counts, 0), axis=0)
        pad = tl.sum(tl.where(offs_e == e, padded, 0), axis=0)
        if count > 0:
            base = start
            for a0 in range(0, A, CHUNK):
                a = a0 + c
                mine = tl.load(ids_ptr + a, mask=a < A, other=-1) == e
                rank = tl.cumsum(mine.to(tl.int32), axis=0)  # inclusive: the first of the chunk is 1
                tl.store(row_assign_ptr + base + rank - 1, a, mask=mine)
                base += tl.sum(mine.to(tl.int32), axis=0)
            r = tl.arange(0, BM)
            tl.store(row_assign_ptr + start + count + r, tl.full((BM,), -1, tl.int32), mask=r < pad - count)
            for b0 in range(start // BM, (start + pad) // BM, CHUNK):
                tl.store(block_expert_ptr + b0 + c, tl.full((CHUNK,), 0, tl.int32) + e,
                         mask=b0 + c < (start + pad) // BM)
    else:  # start: every expert's padded rows
        for r0 in range(start, rows, CHUNK):
            tl.store(row_assign_ptr + r0 + c, tl.full((CHUNK,), -1, tl.int32), mask=r0 + c < rows)
        for b0 in range(start // BM, blocks, CHUNK):
            tl.store(block_expert_ptr + b0 + c, tl.full((CHUNK,), -1, tl.int32), mask=b0 + c < blocks)


def align(ids: torch.Tensor, n_experts: int, block_m: int) -> Alignment:
    """Sort assignments by expert into rows padded to block_m per expert, without a host sync: the
    capacity (every assignment plus up to block_m - 1 padding rows per touched expert) is known from
    the shapes alone. Within an expert, assignments keep their (token, slot) order."""
    flat = ids.reshape(-1)
    a = flat.numel()
    dev = flat.device
    blocks = -(-(a + min(n_experts, a) * (block_m - 1)) // block_m)
    row_assign = torch.empty((blocks * block_m,), dtype=torch.int32, device=dev)
    block_expert = torch.empty((blocks,), dtype=torch.int32, device=dev)
    if 0 < a <= SMALL_ALIGN:
        _align_small_kernel[(1,)](
            flat.to(torch.int32), row_assign, block_expert, a, n_experts, blocks * block_m, blocks,
            BM=block_m, BLOCK_A=triton.next_power_of_2(a), BLOCK_E=triton.next_power_of_2(n_experts),
            BLOCK_R=triton.next_power_of_2(blocks * block_m), BLOCK_B=triton.next_power_of_2(blocks),
            num_warps=4,
        )
        return Alignment(row_assign, block_expert, block_m)
    if a and ALIGN_KERNELS:
        flat = flat.to(torch.int32).contiguous()
        counts = torch.empty((n_experts,), dtype=torch.int32, device=dev)
        _align_count_kernel[(n_experts,)](flat, counts, a, CHUNK=_ALIGN_CHUNK, num_warps=4)
        _align_place_kernel[(n_experts + 1,)](
            flat, counts, row_assign, block_expert, a, n_experts, blocks * block_m, blocks,
            BM=block_m, BLOCK_E=triton.next_power_of_2(n_experts), CHUNK=_ALIGN_CHUNK, num_warps=4,
        )
        return Alignment(row_assign, block_expert, block_m)
    flat = flat.long()
    counts = torch.zeros(n_experts, dtype=torch.long, device=dev).index_add_(0, flat, torch.ones_like(flat))
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    start = counts.cumsum(0) - counts
    rows = padded_start[sorted_e] + torch.arange(a, device=dev) - start[sorted_e]
    row_assign.fill_(-1)
    row_assign[rows] = order.to(torch.int32)
    block_start = torch.arange(blocks, device=dev) * block_m
    block_expert.copy_(torch.searchsorted(padded_end, block_start, right=True).clamp_(max=n_experts))
    block_expert.masked_fill_(block_expert == n_experts, -1)
    return Alignment(row_assign, block_expert, block_m)


# --- grouped FP4 GEMMs


@triton.jit
def _expert_inputs(rows_ptr, valid, k0, W_FP8: tl.constexpr, BK: tl.constexpr):
    """The input tile [K, tokens] that columns k0..k0+BK of the weight meet: whole (FP8), or split into
    the columns of the low and high nibbles (FP4)."""
    if W_FP8:
        a = tl.load(rows_ptr + (k0 + tl.arange(0, BK))[:, None], mask=valid[None, :], other=0.0)
        b = a
    else:
        cols_lo, cols_hi = split_columns(k0, BK)
        a = tl.load(rows_ptr + cols_lo[:, None], mask=valid[None, :], other=0.0)
        b = tl.load(rows_ptr + cols_hi[:, None], mask=valid[None, :], other=0.0)
    return a, b


@triton.jit
def _expert_dot(acc_lo, acc_hi, x_a, x_b, w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                W_FP8: tl.constexpr, SCALE_ROWS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                IEEE: tl.constexpr, ASM: tl.constexpr, SPLIT: tl.constexpr, ROW_SUMS: tl.constexpr = False):
    """(acc_lo, acc_hi) + W[offs_n, k0:k0+BK] @ (the `_expert_inputs` tile), the weight decoded to x's
    dtype, all into acc_lo, or with SPLIT 2 the FP4 high nibbles' products into acc_hi (the caller sums
    the two): one accumulator chains the two MMAs of a K step, and Triton waits for the first before
    issuing the second (sm_90 SASS), two cost a second accumulator's registers. FP8 weights have one
    scale per SCALE_ROWS rows per 32 columns (1: experts re-encoded from FP4; 32: the shared expert's
    32x32 blocks). ROW_SUMS: the interpreter's products (`dot_acc`)."""
    if W_FP8:
        w = fp8_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK, SCALE_ROWS)
        acc_lo = dot_acc(w.to(x_a.dtype), x_a, acc_lo, IEEE, ROW_SUMS)
    else:
        w_lo, w_hi = fp4_split_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK, ASM)
        acc_lo, acc_hi = _split_dots(acc_lo, acc_hi, x_a, x_b, w_lo, w_hi, IEEE, SPLIT, ROW_SUMS)
    return acc_lo, acc_hi


@triton.jit
def _split_dots(acc_lo, acc_hi, x_lo, x_hi, w_lo, w_hi, IEEE: tl.constexpr, SPLIT: tl.constexpr,
                ROW_SUMS: tl.constexpr = False):
    """The two MMAs of an FP4 K step: decoded low / high nibbles' tiles times their input columns, into
    acc_lo, or with SPLIT 2 the high nibbles' into acc_hi (`_expert_dot`). ROW_SUMS: `dot_acc`."""
    acc_lo = dot_acc(w_lo.to(x_lo.dtype), x_lo, acc_lo, IEEE, ROW_SUMS)
    if SPLIT == 2:
        acc_hi = dot_acc(w_hi.to(x_lo.dtype), x_hi, acc_hi, IEEE, ROW_SUMS)
    else:
        acc_lo = dot_acc(w_hi.to(x_lo.dtype), x_hi, acc_lo, IEEE, ROW_SUMS)
    return acc_lo, acc_hi


@triton.jit
def _accumulators(BN: tl.constexpr, BM: tl.constexpr, SPLIT: tl.constexpr):
    """(lo, hi) float32 accumulators of a [BN, BM] tile; hi holds the FP4 high nibbles' products only
    with SPLIT 2 (`_split_dots`), else it is a [BN, 1] zero added at the end."""
    return tl.zeros((BN, BM), dtype=tl.float32), tl.zeros((BN, BM if SPLIT == 2 else 1), dtype=tl.float32)


@triton.jit
def _block_rows(row_assign_ptr, block_expert_ptr, pid_b, BM: tl.constexpr, DIRECT: tl.constexpr):
    """(expert, rows, assignments) of expert block pid_b: its BM aligned rows (assignment -1: padding),
    or DIRECT (decode, no alignment) block pid_b = assignment pid_b alone, block_expert_ptr = the ids, and
    its row of the intermediate activations is the assignment's."""
    expert = tl.load(block_expert_ptr + pid_b)
    if DIRECT:
        assign = tl.where(tl.arange(0, BM) == 0, pid_b, -1)
        rows = tl.maximum(assign, 0)
    else:
        rows = pid_b * BM + tl.arange(0, BM)
        assign = tl.load(row_assign_ptr + rows)
    return expert, rows, assign


@triton.jit
def _gate_up_kernel(
    x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, row_assign_ptr, block_expert_ptr, route_w_ptr, act_ptr,
    inter, H, stride_xm, stride_we, stride_wn, stride_se, stride_sn, limit,
    TOPK: tl.constexpr, W_FP8: tl.constexpr, SCALE_ROWS: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
    BK: tl.constexpr, IEEE: tl.constexpr, ASM: tl.constexpr, DIRECT: tl.constexpr = False,
    EVEN_N: tl.constexpr = False, SPLIT: tl.constexpr = 1, ROW_SUMS: tl.constexpr = False,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert, rows, assign = _block_rows(row_assign_ptr, block_expert_ptr, pid_b, BM, DIRECT)
    if expert < 0:
        return
    valid = assign >= 0
    token = tl.where(valid, assign // TOPK, 0)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_mask = (offs_n < inter) | EVEN_N  # EVEN_N: no masks (BN divides the rows)
    w1_e = w1_ptr + expert.to(tl.int64) * stride_we
    w3_e = w3_ptr + expert.to(tl.int64) * stride_we
    s1_e = s1_ptr + expert.to(tl.int64) * stride_se
    s3_e = s3_ptr + expert.to(tl.int64) * stride_se
    g_lo, g_hi = _accumulators(BN, BM, SPLIT)
    u_lo, u_hi = _accumulators(BN, BM, SPLIT)
    x_rows = x_ptr + token[None, :] * stride_xm
    tl.assume(H > 0)  # no zero-trip path: else ptxas serializes every wgmma (C7515)
    for k0 in range(0, H, BK):
        x_a, x_b = _expert_inputs(x_rows, valid, k0, W_FP8, BK)
        g_lo, g_hi = _expert_dot(g_lo, g_hi, x_a, x_b, w1_e, s1_e, offs_n, k0, n_mask, stride_wn, stride_sn,
                                 W_FP8, SCALE_ROWS, BN, BK, IEEE, ASM, SPLIT, ROW_SUMS)
        u_lo, u_hi = _expert_dot(u_lo, u_hi, x_a, x_b, w3_e, s3_e, offs_n, k0, n_mask, stride_wn, stride_sn,
                                 W_FP8, SCALE_ROWS, BN, BK, IEEE, ASM, SPLIT, ROW_SUMS)
    rw = tl.load(route_w_ptr + assign, mask=valid, other=0.0)
    ptrs = act_ptr + rows[None, :].to(tl.int64) * inter + offs_n[:, None]
    _swiglu_store(g_lo + g_hi, u_lo + u_hi, rw[None, :], limit, ptrs, n_mask[:, None] & valid[None, :])


@triton.jit
def _down_kernel(
    act_ptr, w2_ptr, s2_ptr, row_assign_ptr, block_expert_ptr, y_ptr,
    H, inter, stride_we, stride_wn, stride_se, stride_sn,
    W_FP8: tl.constexpr, SCALE_ROWS: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    IEEE: tl.constexpr, ASM: tl.constexpr, DIRECT: tl.constexpr = False, EVEN_N: tl.constexpr = False,
    SPLIT: tl.constexpr = 1, ROW_SUMS: tl.constexpr = False,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert, rows, assign = _block_rows(row_assign_ptr, block_expert_ptr, pid_b, BM, DIRECT)
    if expert < 0:
        return
    valid = assign >= 0
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_mask = (offs_n < H) | EVEN_N  # EVEN_N: no masks (BN divides the rows)
    w2_e = w2_ptr + expert.to(tl.int64) * stride_we
    s2_e = s2_ptr + expert.to(tl.int64) * stride_se
    acc_lo, acc_hi = _accumulators(BN, BM, SPLIT)
    act_rows = act_ptr + rows[None, :].to(tl.int64) * inter
    tl.assume(inter > 0)  # no zero-trip path: else ptxas serializes every wgmma (C7515)
    for k0 in range(0, inter, BK):
        a_a, a_b = _expert_inputs(act_rows, valid, k0, W_FP8, BK)
        acc_lo, acc_hi = _expert_dot(acc_lo, acc_hi, a_a, a_b, w2_e, s2_e, offs_n, k0, n_mask, stride_wn,
                                     stride_sn, W_FP8, SCALE_ROWS, BN, BK, IEEE, ASM, SPLIT, ROW_SUMS)
    ptrs = y_ptr + assign[None, :].to(tl.int64) * H + offs_n[:, None]
    tl.store(ptrs, (acc_lo + acc_hi).to(y_ptr.dtype.element_ty), mask=n_mask[:, None] & valid[None, :])



# --- grouped FP4 GEMMs through the tensor memory accelerator (prefill buckets only)
# TileConfig.tma nonzero: these kernels. The expert weights' packed bytes are TMA boxes, the scale bytes
# pointer loads (boxes of a transposed copy gained <= 3% on the down kernel, H200 2026-12-02, for 1/16
# more expert memory); programs run weight-tile-fastest (a block's tiles together, so its input rows,
# larger than L2 in all, come from DRAM once: 5-7% faster gate+up, ~20% faster down than block-fastest).
# Bit TMA_ACTS (down tiles): the intermediate activations as boxes too (the TMA gate+up stores them in
# the split order; gathering x into such rows for the gate+up cost more than it saved: 324 / 597 us
# gather vs 140 / none at 2048 / 4096 tokens)
TMA_ACTS = 2


@triton.jit
def _split_pos(n, N):
    """Where columns n of an N-column row land in the split input order of the TMA kernels: the columns
    every 32-column group pairs with its low nibbles (n % 32 < 16), then those of the high nibbles, each
    run in column order, so a K step's two input tiles are contiguous boxes."""
    return (n % 32 >= 16).to(tl.int32) * (N // 2) + (n // 32) * 16 + n % 16


@triton.jit
def _tma_weight_bytes(w_desc, w_row, s_ptrs, k0):
    """A K step's packed FP4 bytes (a box of w_desc, rows from w_row) and scale bytes [BN, BK/32] (s_ptrs:
    those of column group 0)."""
    return w_desc.load([w_row, k0 // 2]), tl.load(s_ptrs + k0 // GROUP_TL)


@triton.jit
def _tma_dot(acc_lo, acc_hi, x_lo, x_hi, packed, sc, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
             ASM: tl.constexpr, SPLIT: tl.constexpr):
    """`_expert_dot` of FP4 bytes and scales already loaded (`_tma_weight_bytes`)."""
    w_lo, w_hi = fp4_split_decode(packed, sc, BN, BK, ASM)
    return _split_dots(acc_lo, acc_hi, x_lo, x_hi, w_lo, w_hi, IEEE, SPLIT)


@triton.jit
def _gate_up_tma_kernel(
    x_ptr, w1_desc, w3_desc, s1_ptr, s3_ptr, row_assign_ptr, block_expert_ptr, route_w_ptr, act_ptr,
    inter, H, stride_xm, stride_se, stride_sn, limit,
    TOPK: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
    ASM: tl.constexpr, SPLIT: tl.constexpr, ACT_SPLIT: tl.constexpr,
):
    """`_gate_up_kernel` for FP4 experts with TMA boxes (module comment above TMA_ACTS); BN divides
    inter. ACT_SPLIT: the activations stored in the split order (`_split_pos`) for `_down_tma_kernel`
    with TMA_ACTS."""
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    expert, rows, assign = _block_rows(row_assign_ptr, block_expert_ptr, pid_b, BM, False)
    if expert < 0:
        return
    valid = assign >= 0
    token = tl.where(valid, assign // TOPK, 0)
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    w_row = expert * inter + n0
    at = expert.to(tl.int64) * stride_se + offs_n[:, None] * stride_sn + tl.arange(0, BK // GROUP_TL)[None, :]
    s1_ptrs = s1_ptr + at
    s3_ptrs = s3_ptr + at
    g_lo, g_hi = _accumulators(BN, BM, SPLIT)
    u_lo, u_hi = _accumulators(BN, BM, SPLIT)
    x_rows = x_ptr + token[None, :] * stride_xm
    tl.assume(H > 0)  # no zero-trip path: else ptxas serializes every wgmma (C7515)
    for k0 in range(0, H, BK):
        x_lo, x_hi = _expert_inputs(x_rows, valid, k0, False, BK)
        # both weights' bytes before the first MMA: a TMA wait (a branch) between the gate's and the up
        # projection's wgmma makes ptxas serialize them (C7513; sm_90 compile of Triton 3.6)
        p1, sc1 = _tma_weight_bytes(w1_desc, w_row, s1_ptrs, k0)
        p3, sc3 = _tma_weight_bytes(w3_desc, w_row, s3_ptrs, k0)
        g_lo, g_hi = _tma_dot(g_lo, g_hi, x_lo, x_hi, p1, sc1, BN, BK, IEEE, ASM, SPLIT)
        u_lo, u_hi = _tma_dot(u_lo, u_hi, x_lo, x_hi, p3, sc3, BN, BK, IEEE, ASM, SPLIT)
    rw = tl.load(route_w_ptr + assign, mask=valid, other=0.0)
    cols = _split_pos(offs_n, inter) if ACT_SPLIT else offs_n
    ptrs = act_ptr + rows[None, :].to(tl.int64) * inter + cols[:, None]
    _swiglu_store(g_lo + g_hi, u_lo + u_hi, rw[None, :], limit, ptrs, valid[None, :])


@triton.jit
def _down_tma_kernel(
    act, w2_desc, s2_ptr, row_assign_ptr, block_expert_ptr, y_ptr, H, inter, stride_se, stride_sn,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, ASM: tl.constexpr,
    SPLIT: tl.constexpr, ACTS: tl.constexpr,
):
    """`_down_kernel` for FP4 experts with TMA boxes; ACTS: act a descriptor over the split-order
    activations (`_gate_up_tma_kernel` with ACT_SPLIT). BN divides H."""
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    expert, rows, assign = _block_rows(row_assign_ptr, block_expert_ptr, pid_b, BM, False)
    if expert < 0:
        return
    valid = assign >= 0
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    w_row = expert * H + n0
    s_ptrs = (s2_ptr + expert.to(tl.int64) * stride_se + offs_n[:, None] * stride_sn
              + tl.arange(0, BK // GROUP_TL)[None, :])
    acc_lo, acc_hi = _accumulators(BN, BM, SPLIT)
    if ACTS:
        act_rows = 0
    else:
        act_rows = act + rows[None, :].to(tl.int64) * inter
    tl.assume(inter > 0)  # no zero-trip path: else ptxas serializes every wgmma (C7515)
    for k0 in range(0, inter, BK):
        if ACTS:  # the low and high nibbles' columns: two boxes of the split-order rows
            a_lo = tl.trans(act.load([pid_b * BM, k0 // 2]))
            a_hi = tl.trans(act.load([pid_b * BM, inter // 2 + k0 // 2]))
        else:
            a_lo, a_hi = _expert_inputs(act_rows, valid, k0, False, BK)
        packed, sc = _tma_weight_bytes(w2_desc, w_row, s_ptrs, k0)
        acc_lo, acc_hi = _tma_dot(acc_lo, acc_hi, a_lo, a_hi, packed, sc, BN, BK, IEEE, ASM, SPLIT)
    ptrs = y_ptr + assign[None, :].to(tl.int64) * H + offs_n[:, None]
    tl.store(ptrs, (acc_lo + acc_hi).to(y_ptr.dtype.element_ty), mask=valid[None, :])


# --- decode GEMVs

# assignments (tokens x top-k) up to which the decode kernels run: each assignment streams its expert's
# rows, so two assignments of one expert read it twice (from L2 at these sizes)
DECODE_ASSIGNMENTS = 64
_GEMV_BN, _GEMV_BK, _GEMV_WARPS = 16, 256, 4  # the shared expert's (FP8) gate+up GEMV


@triton.jit
def _row_products(acc, x_row, w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                  KIND: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr):
    """acc plus the products of weight rows offs_n x columns k0..k0+BK with one input row: float32
    [BN, BK] for FP8 (KIND 0: 32x32 block scales, the shared expert; KIND 2: 1x32, experts re-encoded
    from FP4), column-pair sums [BN, BK/2] for split-layout FP4 (KIND 1)."""
    if KIND == 0:  # BN divides 32: the tile's rows (program_id(1) * BN + ...) share one scale per 32
        # columns, applied to the input instead (exact: powers of two)
        tl.static_assert(GROUP_TL % BN == 0)
        xk = tl.load(x_row + k0 + tl.arange(0, BK)).to(tl.float32)
        s_row = s_ptr + (tl.program_id(1) * BN // GROUP_TL) * stride_sn
        s = tl.load(s_row + k0 // GROUP_TL + tl.arange(0, BK // GROUP_TL))
        xs = tl.reshape(tl.reshape(xk, (BK // GROUP_TL, GROUP_TL)) * pow2(s, 0)[:, None], (BK,))
        cols = tl.multiple_of(k0, BK) + tl.arange(0, BK)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + cols[None, :], mask=n_mask[:, None])
        acc += w.to(tl.float32) * xs[None, :]
    elif KIND == 2:
        xk = tl.load(x_row + k0 + tl.arange(0, BK)).to(tl.float32)
        acc += fp8_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK, 1) * xk[None, :]
    else:
        cols_lo, cols_hi = split_columns(k0, BK)
        x_lo = tl.load(x_row + cols_lo).to(tl.float32)
        x_hi = tl.load(x_row + cols_hi).to(tl.float32)
        acc = fp4_gemv_products(acc, w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, x_lo, x_hi,
                                BN, BK, ASM)
    return acc


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, ids_ptr, route_w_ptr, act_ptr,
    inter, H, stride_xm, stride_we, stride_wn, stride_se, stride_sn, limit,
    TOPK: tl.constexpr, KIND: tl.constexpr, PACK: tl.constexpr, ROUTED: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, ASM: tl.constexpr,
):
    """act[a] = SwiGLU(x[a // TOPK] W1^T, x W3^T), times assignment a's routing weight when ROUTED
    (experts picked by ids); not ROUTED: the shared expert, one program row per token. PACK: weight
    columns per `_row_products` column (2 for FP4)."""
    a = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = offs_n < inter
    x_row = x_ptr + (a // TOPK).to(tl.int64) * stride_xm
    if ROUTED:
        expert = tl.load(ids_ptr + a).to(tl.int64)
        w1_ptr += expert * stride_we
        w3_ptr += expert * stride_we
        s1_ptr += expert * stride_se
        s3_ptr += expert * stride_se
    acc_g = tl.zeros((BN, BK // PACK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK // PACK), dtype=tl.float32)
    for k0 in range(0, H, BK):
        acc_g = _row_products(acc_g, x_row, w1_ptr, s1_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, KIND,
                              BN, BK, ASM)
        acc_u = _row_products(acc_u, x_row, w3_ptr, s3_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, KIND,
                              BN, BK, ASM)
    out_ty = act_ptr.dtype.element_ty
    gate = tl.minimum(tl.sum(acc_g, axis=1).to(out_ty).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(tl.sum(acc_u, axis=1).to(out_ty).to(tl.float32), -limit), limit)
    act = gate / (1.0 + tl.exp(-gate)) * up
    if ROUTED:
        act = act * tl.load(route_w_ptr + a)
    tl.store(act_ptr + a.to(tl.int64) * inter + offs_n, act.to(out_ty), mask=n_mask)


@triton.jit
def _down_gemv_kernel(
    act_ptr, w2_ptr, s2_ptr, ids_ptr, y_ptr, H, inter, stride_we, stride_wn, stride_se, stride_sn,
    KIND: tl.constexpr, PACK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr,
):
    a = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = offs_n < H
    expert = tl.load(ids_ptr + a).to(tl.int64)
    w2_e = w2_ptr + expert * stride_we
    s2_e = s2_ptr + expert * stride_se
    act_row = act_ptr + a.to(tl.int64) * inter
    acc = tl.zeros((BN, BK // PACK), dtype=tl.float32)
    for k0 in range(0, inter, BK):
        acc = _row_products(acc, act_row, w2_e, s2_e, offs_n, k0, n_mask, stride_wn, stride_sn, KIND, BN, BK,
                            ASM)
    tl.store(y_ptr + a.to(tl.int64) * H + offs_n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_mask)


def routed_experts_decode(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PreparedExperts, swiglu_limit: float,
    gemv: configs.TileConfig = configs.MOE_DECODE_DEFAULT,
) -> torch.Tensor:
    """`routed_experts` for few assignments through the GEMV kernels (same rounding points); `gemv`: the
    tile of both (block_n, block_k, num_warps, num_stages)."""
    t, k = ids.shape
    i, h = experts.inter, experts.hidden
    kind, pack = (2, 1) if experts.fp8 else (1, 2)
    asm, c = experts.asm, gemv
    act = torch.empty((t * k, i), dtype=x.dtype, device=x.device)
    _gate_up_gemv_kernel[(t * k, triton.cdiv(i, c.block_n))](
        x, experts.w1, experts.s1, experts.w3, experts.s3, ids.reshape(-1), weights.reshape(-1), act,
        i, h, x.stride(0), experts.w1.stride(0), experts.w1.stride(1),
        experts.s1.stride(0), experts.s1.stride(1), float(swiglu_limit),
        TOPK=k, KIND=kind, PACK=pack, ROUTED=True, BN=c.block_n, BK=configs.block_k(h, c.block_k), ASM=asm,
        num_warps=c.num_warps, num_stages=c.num_stages,
    )
    y = torch.empty((t * k, h), dtype=x.dtype, device=x.device)
    _down_gemv_kernel[(t * k, triton.cdiv(h, c.block_n))](
        act, experts.w2, experts.s2, ids.reshape(-1), y,
        h, i, experts.w2.stride(0), experts.w2.stride(1), experts.s2.stride(0), experts.s2.stride(1),
        KIND=kind, PACK=pack, BN=c.block_n, BK=configs.block_k(i, c.block_k), ASM=asm,
        num_warps=c.num_warps, num_stages=c.num_stages,
    )
    return y


def _shared_gate_up_decode(
    x: torch.Tensor, w1: PreparedLinear, w3: PreparedLinear, limit: float
) -> torch.Tensor:
    """SwiGLU(x W1^T, x W3^T) of the FP8 shared expert in one launch (one program row per token)."""
    t = x.shape[0]
    i, h = w1.out_features, w1.in_features
    act = torch.empty((t, i), dtype=x.dtype, device=x.device)
    _gate_up_gemv_kernel[(t, triton.cdiv(i, _GEMV_BN))](
        x, w1.weight, w1.scale, w3.weight, w3.scale, act, act, act,  # ids / routing weights unused
        i, h, x.stride(0), 0, w1.weight.stride(0), 0, w1.scale.stride(0), float(limit),
        TOPK=1, KIND=0, PACK=1, ROUTED=False, BN=_GEMV_BN, BK=configs.block_k(h, _GEMV_BK), ASM=False,
        num_warps=_GEMV_WARPS,
    )
    return act


@triton.jit
def _combine_kernel(y_ptr, shared_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(y_ptr + (t * TOPK + j).to(tl.int64) * H + offs, mask=mask, other=0.0).to(tl.float32)
    out_ty = out_ptr.dtype.element_ty
    routed = acc.to(out_ty).to(tl.float32)
    shared = tl.load(shared_ptr + t.to(tl.int64) * H + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * H + offs, (routed + shared).to(out_ty), mask=mask)


# --- fused decode path: the shared expert as one more assignment of the routed kernels


@triton.jit
def _one_row_dot(x_row, w_ptr, s_ptr, offs_n, n_mask, k_lo, k_hi, stride_wn, stride_sn,
                 W_FP8: tl.constexpr, SCALE_ROWS: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 BK: tl.constexpr, IEEE: tl.constexpr, ASM: tl.constexpr, w2_ptr=None, s2_ptr=None,
                 PAIR: tl.constexpr = False, ROW_SUMS: tl.constexpr = False):
    """W[offs_n, k_lo:k_hi] x_row[k_lo:k_hi] as float32 [BN], offs_n = program_id(1) * BN + arange(BN):
    BM >= 16, the grouped kernels' MMA with one live token column; BM == 1, CUDA-core products
    (`_row_products`). PAIR: (W x, W2 x) of a second weight (w2_ptr, s2_ptr; same shape and strides) in
    the same K loop (gate and up: H200 2026-12-02, 110 us per MoE layer at batch 1 vs 113 with a loop
    each; BM >= 16: in one MMA tile, `_stacked`), else (W x, W x). ROW_SUMS (BM >= 16): `dot_acc`, as
    the grouped kernels in that mode."""
    if BM == 1:
        if not W_FP8:
            acc = tl.zeros((BN, BK // 2), dtype=tl.float32)
        else:
            acc = tl.zeros((BN, BK), dtype=tl.float32)
        acc2 = tl.zeros_like(acc)
        kind: tl.constexpr = 1 if not W_FP8 else (2 if SCALE_ROWS == 1 else 0)
        for k0 in range(k_lo, k_hi, BK):
            acc = _row_products(acc, x_row, w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, kind,
                                BN, BK, ASM)
            if PAIR:
                acc2 = _row_products(acc2, x_row, w2_ptr, s2_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                                     kind, BN, BK, ASM)
        out = tl.sum(acc, axis=1)
        return out, (tl.sum(acc2, axis=1) if PAIR else out)
    col = tl.arange(0, BM)
    live = col == 0
    rows = x_row + col * 0
    unused = tl.zeros((2 * BN if PAIR else BN, 1), dtype=tl.float32)
    if PAIR:  # W's and W2's rows stacked into one [2 BN, BK] tile: `_stacked` (the same chain per row)
        second = tl.arange(0, 2 * BN) >= BN
        w_ptr = tl.where(second, w2_ptr, w_ptr)[:, None]
        s_ptr = tl.where(second, s2_ptr, s_ptr)[:, None]
        offs_n = _stacked(offs_n, BN)
        n_mask = _stacked(n_mask, BN)
    acc = tl.zeros((2 * BN if PAIR else BN, BM), dtype=tl.float32)
    tl.assume(k_hi > k_lo)  # no zero-trip path: else ptxas serializes every wgmma (C7515)
    for k0 in range(k_lo, k_hi, BK):
        x_a, x_b = _expert_inputs(rows[None, :], live, k0, W_FP8, BK)
        acc, _ = _expert_dot(acc, unused, x_a, x_b, w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                             W_FP8, SCALE_ROWS, 2 * BN if PAIR else BN, BK, IEEE, ASM, 1, ROW_SUMS)
    out = tl.sum(tl.where(live[None, :], acc, 0.0), axis=1)
    if PAIR:
        out, out2 = tl.split(tl.permute(tl.reshape(out, (2, BN)), (1, 0)))
    else:
        out2 = out
    return out, out2


@triton.jit
def _stacked(v, BN: tl.constexpr):
    """[BN] -> [2 BN]: v twice. With PAIR the MMA tiles stack the gate's and the up projection's rows:
    one MMA per K step (H200 2026-12-02, batch 1, 4 warps: fused gate+up 65.5 -> 62.2 us, invariant mode's
    80.9 -> 74.5 us; 8 warps, a warpgroup per projection and twice the warps per SM: 62.3 us, no faster)."""
    return tl.reshape(tl.permute(tl.join(v, v), (1, 0)), (2 * BN,))


@triton.jit
def _decode_gate_up_kernel(
    x_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, sw1_ptr, ss1_ptr, sw3_ptr, ss3_ptr, act_ptr,
    logits_ptr, bias_ptr, bias_vl_ptr, mask_ptr, ids_ptr, route_w_ptr, count_ptr,
    A, E, inter, H, stride_xm, stride_we, stride_wn, stride_se, stride_sn, shared_wn, shared_sn,
    limit, route_scale, n_count, TOPK: tl.constexpr, EXPERT_FP8: tl.constexpr, BN: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, ASM: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_COUNT: tl.constexpr, EVEN_N: tl.constexpr = False,
    ROW_SUMS: tl.constexpr = False,
):
    """act[a] = SwiGLU(x W1^T, x W3^T) of assignment a < A (its expert's, times its routing weight) or of
    token a - A's shared expert (FP8, 32x32 block scales): both in one launch, each program routing its
    token itself (`_route_token`, the same selection in every program) instead of a routing launch.
    The shared expert's first program of a token stores the token's expert ids and routing weights for
    the down launch and, BLOCK_COUNT > 0, zeroes its n_count arrival counters of
    `_decode_down_split_kernel`."""
    a = tl.program_id(0)
    pid_n = tl.program_id(1)
    first = (a >= A) & (pid_n == 0)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_mask = (offs_n < inter) | EVEN_N  # EVEN_N: no masks (BN divides the rows)
    t = tl.where(a < A, a // TOPK, a - A)
    picked_w, picked_id = _route_token(logits_ptr, bias_ptr, bias_vl_ptr, mask_ptr, t, E, route_scale,
                                       HAS_MASK, TOPK, BLOCK_E, BLOCK_K)
    slot = tl.arange(0, BLOCK_K)
    mine = slot == a - t * TOPK
    rw = tl.where(a < A, tl.sum(tl.where(mine, picked_w, 0.0), axis=0), 1.0)  # shared expert: 1 (exact)
    stored = tl.where(first, TOPK, 0)
    tl.store(ids_ptr + t * TOPK + slot, picked_id, mask=slot < stored)
    tl.store(route_w_ptr + t * TOPK + slot, picked_w, mask=slot < stored)
    if BLOCK_COUNT > 0:
        c = tl.arange(0, BLOCK_COUNT)
        zeroed = tl.where(first, n_count, 0)
        tl.store(count_ptr + t * n_count + c, tl.zeros((BLOCK_COUNT,), dtype=tl.int32), mask=c < zeroed)
    x_row = x_ptr + t.to(tl.int64) * stride_xm
    if a < A:
        expert = tl.sum(tl.where(mine, picked_id, 0), axis=0).to(tl.int64)
        gate, up = _one_row_dot(x_row, w1_ptr + expert * stride_we, s1_ptr + expert * stride_se, offs_n,
                                n_mask, 0, H, stride_wn, stride_sn, EXPERT_FP8, 1, BN, BM, BK, IEEE, ASM,
                                w3_ptr + expert * stride_we, s3_ptr + expert * stride_se, PAIR=True,
                                ROW_SUMS=ROW_SUMS)
    else:
        gate, up = _one_row_dot(x_row, sw1_ptr, ss1_ptr, offs_n, n_mask, 0, H, shared_wn, shared_sn, True,
                                GROUP_TL, BN, BM, BK, IEEE, False, sw3_ptr, ss3_ptr, PAIR=True,
                                ROW_SUMS=ROW_SUMS)
    _swiglu_store(gate, up, rw, limit, act_ptr + a.to(tl.int64) * inter + offs_n, n_mask)


@triton.jit
def _swiglu_store(gate, up, rw, limit, act_ptrs, n_mask):
    """act = SwiGLU(gate, up) * rw at the reference's rounding points (gate and up products rounded to
    act's dtype first), stored."""
    out_ty = act_ptrs.dtype.element_ty
    gate = tl.minimum(gate.to(out_ty).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(up.to(out_ty).to(tl.float32), -limit), limit)
    act = gate / (1.0 + tl.exp(-gate)) * up * rw
    tl.store(act_ptrs, act.to(out_ty), mask=n_mask)


@triton.jit
def _decode_down_kernel(
    act_ptr, w2_ptr, s2_ptr, ids_ptr, sw2_ptr, ss2_ptr, out_ptr,
    A, H, inter, stride_we, stride_wn, stride_se, stride_sn, shared_wn, shared_sn,
    TOPK: tl.constexpr, EXPERT_FP8: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    IEEE: tl.constexpr, ASM: tl.constexpr, EVEN_N: tl.constexpr = False, ROW_SUMS: tl.constexpr = False,
):
    """out[t] = (sum over slots of round(expert W2 act)) rounded, plus round(shared W2 act), rounded: the
    down projections of token t's TOPK assignments and its shared expert and `_combine_kernel`'s sum
    in one program per (token, tile of H), slots in order (deterministic, no atomics)."""
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = (offs_n < H) | EVEN_N  # EVEN_N: no masks (BN divides the rows)
    out_ty = out_ptr.dtype.element_ty
    routed = tl.zeros((BN,), dtype=tl.float32)
    for j in range(TOPK):
        a = t * TOPK + j
        expert = tl.load(ids_ptr + a).to(tl.int64)
        y, _ = _one_row_dot(act_ptr + a.to(tl.int64) * inter, w2_ptr + expert * stride_we,
                            s2_ptr + expert * stride_se, offs_n, n_mask, 0, inter, stride_wn, stride_sn,
                            EXPERT_FP8, 1, BN, BM, BK, IEEE, ASM, ROW_SUMS=ROW_SUMS)
        routed += y.to(out_ty).to(tl.float32)
    shared, _ = _one_row_dot(act_ptr + (A + t).to(tl.int64) * inter, sw2_ptr, ss2_ptr, offs_n, n_mask, 0,
                             inter, shared_wn, shared_sn, True, GROUP_TL, BN, BM, BK, IEEE, False,
                             ROW_SUMS=ROW_SUMS)
    out = routed.to(out_ty).to(tl.float32) + shared.to(out_ty).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * H + offs_n, out.to(out_ty), mask=n_mask)


@triton.jit
def _decode_down_split_kernel(
    act_ptr, w2_ptr, s2_ptr, ids_ptr, sw2_ptr, ss2_ptr, y_ptr, count_ptr, out_ptr,
    A, H, inter, stride_we, stride_wn, stride_se, stride_sn, shared_wn, shared_sn,
    TOPK: tl.constexpr, EXPERT_FP8: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    IEEE: tl.constexpr, ASM: tl.constexpr, EVEN_N: tl.constexpr = False, ROW_SUMS: tl.constexpr = False,
):
    """`_decode_down_kernel` with one program per (assignment or shared expert, tile of H): each stores its
    rounded rows, and the last of a token's TOPK + 1 to arrive (an arrival counter per token and tile,
    zeroed by the gate+up launch) sums them in slot order, as `_decode_down_kernel` does (bitwise)."""
    a = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_mask = (offs_n < H) | EVEN_N  # EVEN_N: no masks (BN divides the rows)
    out_ty = out_ptr.dtype.element_ty
    if a < A:
        expert = tl.load(ids_ptr + a).to(tl.int64)
        y, _ = _one_row_dot(act_ptr + a.to(tl.int64) * inter, w2_ptr + expert * stride_we,
                            s2_ptr + expert * stride_se, offs_n, n_mask, 0, inter, stride_wn, stride_sn,
                            EXPERT_FP8, 1, BN, BM, BK, IEEE, ASM, ROW_SUMS=ROW_SUMS)
        t = a // TOPK
    else:
        y, _ = _one_row_dot(act_ptr + a.to(tl.int64) * inter, sw2_ptr, ss2_ptr, offs_n, n_mask, 0,
                            inter, shared_wn, shared_sn, True, GROUP_TL, BN, BM, BK, IEEE, False,
                            ROW_SUMS=ROW_SUMS)
        t = a - A
    tl.store(y_ptr + a.to(tl.int64) * H + offs_n, y.to(out_ty), mask=n_mask)
    tl.debug_barrier()  # every thread's rows are stored before the counter's release
    if tl.atomic_add(count_ptr + t * tl.num_programs(1) + pid_n, 1, sem="acq_rel", scope="gpu") == TOPK:
        routed = tl.zeros((BN,), dtype=tl.float32)
        for j in range(TOPK):
            row = y_ptr + (t * TOPK + j).to(tl.int64) * H
            routed += tl.load(row + offs_n, mask=n_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        shared = tl.load(y_ptr + (A + t).to(tl.int64) * H + offs_n, mask=n_mask, other=0.0,
                         cache_modifier=".cg")
        out = routed.to(out_ty).to(tl.float32) + shared.to(tl.float32)
        tl.store(out_ptr + t.to(tl.int64) * H + offs_n, out.to(out_ty), mask=n_mask)


def _decode_fused(x: torch.Tensor, logits: torch.Tensor, image_mask: torch.Tensor | None, layer: Any,
                  up_cfg: configs.TileConfig, down_cfg: configs.TileConfig, row_sums: bool = False
                  ) -> torch.Tensor:
    """The MoE output [T, H] of few tokens from the router logits in two launches: routing, gate+up of
    every assignment and of each token's FP8 shared expert (`_decode_gate_up_kernel`), then the down
    projections with the combine: one program per (token, tile) looping over its slots
    (`_decode_down_kernel`), or with the down tile's split_k > 1 one program per (slot, tile) and the last
    to arrive combining (`_decode_down_split_kernel`). Tiles: BM 1 = CUDA-core products (BN must divide
    32: the shared expert's block scales), BM >= 16 = MMA with one live column. `row_sums` (batch-invariant
    mode in the interpreter): the MMA tiles' products summed by tl.sum (`dot_acc`), as `_grouped_mlp`'s."""
    t, e = logits.shape
    k = layer.topk
    p, w1, w3, w2 = layer.experts, layer.shared_w1, layer.shared_w3, layer.shared_w2
    i, h = p.inter, p.hidden
    for c in (up_cfg, down_cfg):
        if c.block_m == 1 and GROUP % c.block_n:
            raise ValueError(f"fused MoE decode: CUDA-core tile block_n {c.block_n} must divide {GROUP}")
    ieee = x.dtype == torch.float32
    split = down_cfg.split_k > 1
    down_tiles = triton.cdiv(h, down_cfg.block_n)
    act = torch.empty((t * k + t, i), dtype=x.dtype, device=x.device)
    ids = torch.empty((t * k,), dtype=torch.int32, device=x.device)
    weights = torch.empty((t * k,), dtype=torch.float32, device=x.device)
    count = torch.empty((t * down_tiles if split else 1,), dtype=torch.int32, device=x.device)
    c = up_cfg
    if c.split_k != 1:  # split K over H measured slower (H200 2026-12-02: 138 vs 110 us at batch 1)
        raise ValueError(f"fused MoE decode: gate+up tile split_k {c.split_k}, expected 1")
    _decode_gate_up_kernel[(t * k + t, triton.cdiv(i, c.block_n))](
        x, p.w1, p.s1, p.w3, p.s3, w1.weight, w1.scale, w3.weight, w3.scale, act,
        logits.contiguous(), layer.bias, layer.bias_vl, ids if image_mask is None else image_mask, ids,
        weights, count, t * k, e, i, h, x.stride(0), p.w1.stride(0), p.w1.stride(1),
        p.s1.stride(0), p.s1.stride(1), w1.weight.stride(0), w1.scale.stride(0), float(layer.swiglu_limit),
        float(layer.route_scale), down_tiles, TOPK=k, EXPERT_FP8=p.fp8, BN=c.block_n, BM=c.block_m,
        BK=configs.block_k(h, c.block_k),
        IEEE=ieee, ASM=p.asm, HAS_MASK=image_mask is not None, BLOCK_E=triton.next_power_of_2(e),
        BLOCK_K=triton.next_power_of_2(k), BLOCK_COUNT=triton.next_power_of_2(down_tiles) if split else 0,
        EVEN_N=i % c.block_n == 0, ROW_SUMS=row_sums, num_warps=c.num_warps, num_stages=c.num_stages,
        maxnreg=c.maxnreg or None,
    )
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)
    c = down_cfg
    strides = (p.w2.stride(0), p.w2.stride(1), p.s2.stride(0), p.s2.stride(1), w2.weight.stride(0),
               w2.scale.stride(0))
    meta = dict(TOPK=k, EXPERT_FP8=p.fp8, BN=c.block_n, BM=c.block_m, BK=configs.block_k(i, c.block_k),
                IEEE=ieee, ASM=p.asm, EVEN_N=h % c.block_n == 0, ROW_SUMS=row_sums, num_warps=c.num_warps,
                num_stages=c.num_stages, maxnreg=c.maxnreg or None)
    if split:
        y = torch.empty((t * k + t, h), dtype=x.dtype, device=x.device)
        _decode_down_split_kernel[(t * k + t, down_tiles)](
            act, p.w2, p.s2, ids, w2.weight, w2.scale, y, count, out, t * k, h, i, *strides, **meta,
        )
    else:
        _decode_down_kernel[(t, down_tiles)](
            act, p.w2, p.s2, ids, w2.weight, w2.scale, out, t * k, h, i, *strides, **meta,
        )
    return out


@dataclass(frozen=True)
class _Mlp:
    """Stacked SwiGLU MLP weights as the grouped kernels read them."""

    w1: torch.Tensor
    s1: torch.Tensor
    w3: torch.Tensor
    s3: torch.Tensor
    w2: torch.Tensor
    s2: torch.Tensor
    fp8: bool
    scale_rows: int  # FP8: weight rows per scale (1 or 32)
    expert_strides: bool  # stacked [E, ...] (else one [N, K] matrix, expert strides 0)
    asm: bool = False  # FP4: the packed PTX decode

    def strides(self, w: torch.Tensor, s: torch.Tensor) -> tuple[int, int, int, int]:
        """(expert, row) strides of a weight and of its scale."""
        if self.expert_strides:
            return w.stride(0), w.stride(1), s.stride(0), s.stride(1)
        return 0, w.stride(0), 0, s.stride(0)


def _grouped_mlp(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, mlp: _Mlp, n_experts: int, inter: int,
    swiglu_limit: float, cfg: configs.TileConfig, direct: bool = False,
    down_cfg: configs.TileConfig | None = None, row_sums: bool = False,
) -> torch.Tensor:
    """Rows [T * k, H] (x's dtype) of each (token, slot)'s expert MLP through alignment and the grouped
    gate+up / down kernels with tile config `cfg` (down: `down_cfg` where given, same block_m);
    `direct`: one block per assignment, no alignment (decode: the MMA kernels with one live token column
    instead of the GEMVs); `row_sums` (batch-invariant mode in the interpreter): products summed by tl.sum,
    not tl.dot (`dot_acc`)."""
    down_cfg = down_cfg or cfg
    for c in (cfg, down_cfg):
        if c.split_k not in (1, 2):
            raise ValueError(f"grouped MoE tile {c}: split_k must be 1 or 2")
    if down_cfg.block_m != cfg.block_m:
        raise ValueError(f"grouped MoE: down block_m {down_cfg.block_m} != gate+up block_m {cfg.block_m}")
    t, k = ids.shape
    h = x.shape[1]
    al = None
    if direct:
        flat = ids.reshape(-1).to(torch.int32)
        blocks, row_assign, block_expert, rows = t * k, flat, flat, t * k  # row_assign unused
    else:
        al = align(ids, n_experts, cfg.block_m)
        blocks, row_assign, block_expert = al.blocks, al.row_assign, al.block_expert
        rows = blocks * cfg.block_m
    ieee = x.dtype == torch.float32
    act = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    if cfg.tma or down_cfg.tma:
        _check_tma(mlp, direct, h, inter, cfg, down_cfg)
    if cfg.tma:
        _gate_up_tma(x, weights, mlp, al, act, k, swiglu_limit, cfg, bool(down_cfg.tma & TMA_ACTS))
    else:
        we, wn, se, sn = mlp.strides(mlp.w1, mlp.s1)
        _gate_up_kernel[(blocks, triton.cdiv(inter, cfg.block_n))](
            x, mlp.w1, mlp.s1, mlp.w3, mlp.s3, row_assign, block_expert, weights.reshape(-1), act,
            inter, h, x.stride(0), we, wn, se, sn, float(swiglu_limit),
            TOPK=k, W_FP8=mlp.fp8, SCALE_ROWS=mlp.scale_rows, BN=cfg.block_n, BM=cfg.block_m,
            BK=configs.block_k(h, cfg.block_k), IEEE=ieee, ASM=mlp.asm, DIRECT=direct,
            EVEN_N=inter % cfg.block_n == 0, SPLIT=cfg.split_k, ROW_SUMS=row_sums, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, maxnreg=cfg.maxnreg or None,
        )
    y = torch.empty((t * k, h), dtype=x.dtype, device=x.device)
    if down_cfg.tma:
        _down_tma(act, mlp, al, y, down_cfg)
        return y
    we, wn, se, sn = mlp.strides(mlp.w2, mlp.s2)
    c = down_cfg
    _down_kernel[(blocks, triton.cdiv(h, c.block_n))](
        act, mlp.w2, mlp.s2, row_assign, block_expert, y, h, inter, we, wn, se, sn,
        W_FP8=mlp.fp8, SCALE_ROWS=mlp.scale_rows, BN=c.block_n, BM=c.block_m,
        BK=configs.block_k(inter, c.block_k), IEEE=ieee, ASM=mlp.asm, DIRECT=direct,
        EVEN_N=h % c.block_n == 0, SPLIT=c.split_k, ROW_SUMS=row_sums, num_warps=c.num_warps,
        num_stages=c.num_stages,
        maxnreg=c.maxnreg or None,
    )
    return y


def _check_tma(mlp: _Mlp, direct: bool, h: int, inter: int, cfg: configs.TileConfig,
               down_cfg: configs.TileConfig) -> None:
    """The TMA kernels serve stacked FP4 experts through an alignment, with tiles dividing the rows."""
    if mlp.fp8 or direct or not mlp.expert_strides:
        raise ValueError("grouped MoE: TMA tiles (TileConfig.tma) serve aligned stacked FP4 experts only")
    if (cfg.tma and inter % cfg.block_n) or (down_cfg.tma and h % down_cfg.block_n):
        raise ValueError(f"grouped MoE: TMA tiles {cfg}, {down_cfg}: block_n must divide {inter} / {h}")
    if (cfg.tma | down_cfg.tma) & ~(1 | TMA_ACTS):
        raise ValueError(f"grouped MoE: TMA tiles {cfg}, {down_cfg}: tma takes the bits 1 and TMA_ACTS")
    if cfg.tma & TMA_ACTS:
        raise ValueError(f"grouped MoE: gate+up tile {cfg}: TMA_ACTS is a down-tile bit")
    if down_cfg.tma & TMA_ACTS and not cfg.tma:
        raise ValueError("grouped MoE: a down tile with TMA_ACTS needs a TMA gate+up tile (split-order rows)")


def _box(t: torch.Tensor, rows: int, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor over t viewed as a [rows, -1] matrix, boxes of `block`."""
    return TensorDescriptor.from_tensor(t.view(rows, -1), block)


def _gate_up_tma(x: torch.Tensor, route_w: torch.Tensor, mlp: _Mlp, al: Alignment, act: torch.Tensor,
                 topk: int, limit: float, cfg: configs.TileConfig, act_split: bool) -> None:
    e, i = mlp.w1.shape[:2]
    h = x.shape[1]
    bn, bm, bk = cfg.block_n, cfg.block_m, configs.block_k(h, cfg.block_k)
    _gate_up_tma_kernel[(i // bn, al.blocks)](
        x, _box(mlp.w1, e * i, [bn, bk // 2]), _box(mlp.w3, e * i, [bn, bk // 2]), mlp.s1, mlp.s3,
        al.row_assign, al.block_expert, route_w.reshape(-1), act, i, h, x.stride(0),
        mlp.s1.stride(0), mlp.s1.stride(1), float(limit),
        TOPK=topk, BN=bn, BM=bm, BK=bk, IEEE=x.dtype == torch.float32, ASM=mlp.asm, SPLIT=cfg.split_k,
        ACT_SPLIT=act_split, num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg or None,
    )


def _down_tma(act: torch.Tensor, mlp: _Mlp, al: Alignment, y: torch.Tensor, cfg: configs.TileConfig) -> None:
    e, h = mlp.w2.shape[:2]
    i = act.shape[1]
    bn, bm, bk = cfg.block_n, cfg.block_m, configs.block_k(i, cfg.block_k)
    acts = bool(cfg.tma & TMA_ACTS)
    _down_tma_kernel[(h // bn, al.blocks)](
        _box(act, act.shape[0], [bm, bk // 2]) if acts else act, _box(mlp.w2, e * h, [bn, bk // 2]), mlp.s2,
        al.row_assign, al.block_expert, y, h, i, mlp.s2.stride(0), mlp.s2.stride(1),
        BN=bn, BM=bm, BK=bk, IEEE=act.dtype == torch.float32, ASM=mlp.asm, SPLIT=cfg.split_k, ACTS=acts,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg or None,
    )


# Batch-invariant mode: one MMA chain per output for every batch, no GEMV path, so a row's reduction order
# is fixed by the weight shape alone (an output element's MMA chain never depends on the other rows of its
# tile). INVARIANT_CONFIG sets the chain (K steps of 128; FP4: the low nibbles' MMA, then the high
# nibbles', into one accumulator) and is the tile of few assignments per expert (`invariant_tiles`)
INVARIANT_CONFIG = configs.TileConfig(block_n=64, block_m=16, block_k=128, split_k=1, num_warps=4,
                                      num_stages=4)
# More assignments per expert (a prefill) take tiles with that chain, changing only what a wgmma chain makes
# irrelevant to each output's sums: rows per tile (an m64 MMA per warpgroup), tokens per expert block (the
# MMA's N side), warps, stages, registers, TMA loads (bitwise the pointer kernels). 16-token blocks decode
# each expert's weights once per 16 tokens: 4x the decode work of the default's 64-token blocks.
# FP4 experts' (gate+up, down) per tokens per block: 64 = the H200 table's 2048/4096-token gate+up tile (its
# K step is 128 already) and its down tile with K steps of 128 instead of 64 (207 registers, no spill; sm_90
# compile here, Triton 3.9), by pointers where the TMA tiles do not divide the rows; 32 = the table's
# 8192-assignment tile.
INVARIANT_PREFILL = (configs.TileConfig(128, 64, 128, 1, 8, 3, maxnreg=128, tma=1),
                     configs.TileConfig(256, 64, 128, 1, 8, 3, tma=1 | TMA_ACTS))
_INVARIANT_FP4 = {16: (INVARIANT_CONFIG, INVARIANT_CONFIG),
                  32: (replace(INVARIANT_CONFIG, block_m=32),) * 2,
                  64: INVARIANT_PREFILL}
_INVARIANT_FP4_POINTERS = (configs.TileConfig(128, 64, 128, 1, 8, 3),) * 2
# FP8 weights (the shared expert, E4M3 experts; pointer kernels): one MMA per K step leaves the chain as it
# is whatever the K step, and gate+up steps of 32 keep the two decoded tiles in registers (the same compile:
# at 128 columns 64x16 tiles spill 708 bytes, 64x32 812, 128x64 956; at 32 none, 162-232 registers)
INVARIANT_FP8 = {16: (configs.TileConfig(64, 16, 32, 1, 4, 4), INVARIANT_CONFIG),
                 32: (configs.TileConfig(64, 32, 32, 1, 4, 4), configs.TileConfig(64, 32, 64, 1, 4, 4)),
                 64: (configs.TileConfig(128, 64, 32, 1, 8, 4), configs.TileConfig(128, 64, 64, 1, 8, 3))}


def invariant_tiles(x: torch.Tensor, assignments: int, n_experts: int, fp4: bool, h: int, inter: int
                    ) -> tuple[configs.TileConfig, configs.TileConfig]:
    """(gate+up, down) tiles of the batch-invariant grouped path, all with INVARIANT_CONFIG's chain:
    64-token blocks from 24 mean assignments per expert, 32-token ones from 16, each only while its gate+up
    tiles still fill the SMs (the one-expert shared MLP of a few hundred tokens), else 16; INVARIANT_CONFIG
    always off CUDA or for float32 operands (FMA dots, the interpreter's numpy matmul: one tile there)."""
    if not x.is_cuda or x.dtype == torch.float32:
        return INVARIANT_CONFIG, INVARIANT_CONFIG
    tiles = dict(_INVARIANT_FP4) if fp4 else INVARIANT_FP8
    if fp4 and (inter % INVARIANT_PREFILL[0].block_n or h % INVARIANT_PREFILL[1].block_n):
        tiles[64] = _INVARIANT_FP4_POINTERS  # the TMA kernels take whole tiles
    per_expert, sms = assignments / n_experts, configs.sm_count(x.device)
    for block_m, least in ((64, 24), (32, 16)):
        if per_expert >= least and assignments // block_m * (inter // tiles[block_m][0].block_n) >= sms:
            return tiles[block_m]
    return tiles[16]


def routed_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: PreparedExperts, swiglu_limit: float,
    config: configs.TileConfig | None = None, down_config: configs.TileConfig | None = None,
    row_sums: bool = False,
) -> torch.Tensor:
    """Per (token, slot) expert outputs [T * k, H] in x's dtype (rows of slot order within a token).
    `config`: that tile config and the grouped kernels at any size, the down kernel at `down_config` where
    given (else, for few assignments, the decode path of `configs.lookup_moe_decode`; above, the tuned
    table's configs). `row_sums` (with `config`; batch-invariant mode in the interpreter): the grouped
    kernels' products summed by tl.sum (`dot_acc`)."""
    t, k = ids.shape
    e, i, h = experts.n_experts, experts.inter, experts.hidden
    if t == 0:
        return torch.empty((0, h), dtype=x.dtype, device=x.device)
    p = experts
    mlp = _Mlp(p.w1, p.s1, p.w3, p.s3, p.w2, p.s2, p.fp8, 1, True, p.asm)
    if t * k <= DECODE_ASSIGNMENTS and config is None:
        cfg = DECODE_OVERRIDE or configs.lookup_moe_decode(h, i, x.device)
        if cfg.block_m == 1:
            return routed_experts_decode(x, weights, ids, experts, swiglu_limit, cfg)
        return _grouped_mlp(x, weights, ids, mlp, e, i, swiglu_limit, cfg, direct=True)
    if config is not None:
        return _grouped_mlp(x, weights, ids, mlp, e, i, swiglu_limit, config, down_cfg=down_config,
                            row_sums=row_sums)
    cfg = configs.lookup_moe(t * k, e, h, i, x.device)
    down = configs.lookup_moe_down(t * k, e, h, i, x.device, cfg)
    return _grouped_mlp(x, weights, ids, mlp, e, i, swiglu_limit, cfg, down_cfg=down)


# decode-path tile forced over the table's (configs.lookup_moe_decode; benchmarks compare paths in one
# process): block_m 1 = the GEMVs, else the MMA kernels with one block per assignment
DECODE_OVERRIDE: configs.TileConfig | None = None


_ROUTER_BM, _ROUTER_BN, _ROUTER_BK = 16, 64, 128


@triton.jit
def _router_kernel(x_ptr, g_ptr, out_ptr, T, E, H, stride_xm, stride_ge,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                   ROW_SUMS: tl.constexpr = False):
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_mask = offs_m < T
    n_mask = offs_n < E
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, H, BK):
        offs_k = k0 + tl.arange(0, BK)
        k_mask = offs_k < H
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        g = tl.load(g_ptr + offs_n[None, :] * stride_ge + offs_k[:, None],
                    mask=n_mask[None, :] & k_mask[:, None], other=0.0)
        acc = dot_acc(x, g, acc, IEEE, ROW_SUMS)
    tl.store(out_ptr + offs_m[:, None] * E + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


# tokens up to which the router runs `_router_gemv_kernel` instead of cuBLAS (H200 2026-12-02 01:27, Flash
# router 384 x 5120 at one token: 4.8 us vs cuBLAS's split-K GEMM + reduce 5.0 + 1.5 us; more tokens untimed)
ROUTER_GEMV_TOKENS = 1
_ROUTER_GEMV_ROWS, _ROUTER_GEMV_ELEMS = 2, 2048  # experts per program; tokens x columns per K step


@triton.jit
def _router_gemv_kernel(x_ptr, g_ptr, out_ptr, T, E, H, stride_xm, stride_ge,
                        BT: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr):
    """logits[:T, BE experts] on the CUDA cores: each program streams its experts' rows once for every
    token (few), float32 products of the BF16 operands (exact) summed in float32."""
    offs_e = tl.program_id(0) * BE + tl.arange(0, BE)
    offs_t = tl.arange(0, BT)
    e_mask = offs_e < E
    t_mask = offs_t < T
    acc = tl.zeros((BT, BE, BK), dtype=tl.float32)
    for k0 in range(0, H, BK):
        offs_k = tl.multiple_of(k0, BK) + tl.arange(0, BK)
        g = tl.load(g_ptr + offs_e[:, None] * stride_ge + offs_k[None, :], mask=e_mask[:, None], other=0.0)
        x = tl.load(x_ptr + offs_t[:, None] * stride_xm + offs_k[None, :], mask=t_mask[:, None], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * g.to(tl.float32)[None, :, :]
    out = tl.sum(acc, axis=2)
    tl.store(out_ptr + offs_t[:, None] * E + offs_e[None, :], out, mask=t_mask[:, None] & e_mask[None, :])


def router_logits(x: torch.Tensor, gate: torch.Tensor, *, batch_invariant: bool = False) -> torch.Tensor:
    """x gate^T in float32 (the reference's router precision): cuBLAS, or for at most ROUTER_GEMV_TOKENS
    tokens `_router_gemv_kernel`. Batch-invariant: a fixed-tile Triton GEMM (BF16 operands, or float32 ones
    in IEEE precision, float32 accumulation) instead of cuBLAS, whose algorithm choice follows the row
    count."""
    t, h = x.shape
    if not batch_invariant and 0 < t <= ROUTER_GEMV_TOKENS and h % GROUP == 0:
        e = gate.shape[0]
        out = torch.empty((t, e), dtype=torch.float32, device=x.device)
        bt = triton.next_power_of_2(t)
        bk = configs.block_k(h, max(GROUP, _ROUTER_GEMV_ELEMS // bt))
        x, gate = (v if v.stride(-1) == 1 else v.contiguous() for v in (x, gate))
        _router_gemv_kernel[(triton.cdiv(e, _ROUTER_GEMV_ROWS),)](
            x, gate, out, t, e, h, x.stride(0), gate.stride(0), BT=bt, BE=_ROUTER_GEMV_ROWS, BK=bk,
            num_warps=4,
        )
        return out
    if not batch_invariant:
        return mm_out(x, gate, torch.float32)
    e = gate.shape[0]
    bf16 = x.dtype == gate.dtype == torch.bfloat16
    if not bf16:  # products of float32 (tiny test configs) in float32
        x, gate = x.float(), gate.float()
    x, gate = x.contiguous(), gate.contiguous()
    out = torch.empty((t, e), dtype=torch.float32, device=x.device)
    if t:
        _router_kernel[(triton.cdiv(t, _ROUTER_BM), triton.cdiv(e, _ROUTER_BN))](
            x, gate, out, t, e, h, x.stride(0), gate.stride(0),
            BM=_ROUTER_BM, BN=_ROUTER_BN, BK=_ROUTER_BK, IEEE=not bf16, ROW_SUMS=not x.is_cuda, num_warps=4,
            num_stages=3,
        )
    return out


def moe(
    x: torch.Tensor, layer: Any, image_mask: torch.Tensor | None = None, *, batch_invariant: bool = False
) -> torch.Tensor:
    """The MoE sub-layer for `layer` (deepinfer.ops MoEWeights with cuda-prepared experts/linears).

    `batch_invariant`: a token's output does not depend on the batch around it (bitwise): the
    router GEMM, the routed experts and the FP8 shared expert run fixed-tile kernels at every size (up
    to DECODE_ASSIGNMENTS the fused decode kernels at that tile: `_fused_decode_tiles`)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    mask = image_mask.reshape(-1) if image_mask is not None else None
    xe = x2.to(layer.dtype)
    if xe.stride(-1) != 1:
        xe = xe.contiguous()
    fused = _fused_decode_tiles(x2.shape[0], layer, batch_invariant)
    # batch-invariant mode off CUDA (the interpreter): products summed by tl.sum, not by numpy's matmul,
    # whose sums follow a token's place in the tile (`dot_acc`)
    row_sums = batch_invariant and not x.is_cuda
    if fused is not None:
        logits = router_logits(x2, layer.gate, batch_invariant=batch_invariant)
        return _decode_fused(xe, logits, mask, layer, *fused, row_sums=row_sums).reshape(shape)
    main, side = _streams(x.device)
    if side is not None:
        side.wait_stream(main)
    with torch.cuda.stream(side):  # None: no-op
        shared = _shared_expert_invariant(xe, layer) if batch_invariant else _shared_expert(xe, layer)
    logits = router_logits(x2, layer.gate, batch_invariant=batch_invariant)
    weights, ids = route(logits, layer.bias, layer.bias_vl, mask, layer.topk, layer.route_scale)
    p = layer.experts
    cfg = down = None
    if batch_invariant:
        cfg, down = invariant_tiles(xe, ids.numel(), p.n_experts, not p.fp8, p.hidden, p.inter)
    y = routed_experts(xe, weights, ids, p, layer.swiglu_limit, cfg, down, row_sums=row_sums)
    if side is not None:
        main.wait_stream(side)
    out = torch.empty((x2.shape[0], shape[-1]), dtype=layer.dtype, device=x.device)
    if x2.shape[0]:
        block = 1024
        _combine_kernel[(x2.shape[0], triton.cdiv(shape[-1], block))](
            y, shared, out, shape[-1], TOPK=layer.topk, BLOCK=block, num_warps=4,
        )
    return out.reshape(shape)


# The shared expert beside the routing and the routed experts, on a second stream (the unfused path:
# above DECODE_ASSIGNMENTS): it needs only x, and the routing's small launches leave SMs idle (H200
# 2026-12-02, 64 tokens: 1798 -> 1737 and 1804 -> 1769 us in two runs; at 2048 / 4096 tokens within the
# run-to-run spread: the grouped GEMMs fill every SM). Same kernels, same output. Every fork waits for
# the caller's stream, so a block the caching allocator hands back to either stream is never still in
# use (inside CUDA graph capture too: the second stream joins the capture). False: one stream
# (benchmarks compare).
SHARED_STREAM = True
_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _streams(device: torch.device) -> tuple[Any, torch.cuda.Stream | None]:
    """(the caller's stream, the shared expert's second stream), or (None, None) off CUDA or with
    SHARED_STREAM off."""
    if not SHARED_STREAM or device.type != "cuda":
        return None, None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return torch.cuda.current_stream(index), _SIDE_STREAMS[index]


def _is_fp8_block(w: Any) -> bool:
    return isinstance(w, PreparedLinear) and w.kind == "fp8" and w.groups == 1


# fused decode path's down tile forced over the table's (configs.lookup_moe_decode_down): a TileConfig,
# or False for the unfused path (benchmarks compare them in one process)
DECODE_DOWN_OVERRIDE: configs.TileConfig | bool | None = None


def _fused_decode_tiles(t: int, layer: Any, invariant: bool = False
                        ) -> tuple[configs.TileConfig, configs.TileConfig] | None:
    """(gate+up, down) tiles of `_decode_fused` for t tokens, or None where the unfused path runs: above
    DECODE_ASSIGNMENTS, a shared expert that is not FP8 with 32x32 blocks, or no down tile in the table.
    `invariant` (batch-invariant mode): INVARIANT_CONFIG for both, down a program per slot. Bitwise the
    unfused invariant path (grouped kernels at INVARIANT_CONFIG, the shared expert as a one-expert MLP at
    the same tile, the combine kernel): each output column's MMA chain is the same (same tile and K
    order, one live column instead of up to 16), so are the routing (`_route_token` of the same logits),
    the rounding points and the slot-order sum; 3 launches instead of ~9 at batch 1."""
    shared = (layer.shared_w1, layer.shared_w3, layer.shared_w2)
    if DECODE_DOWN_OVERRIDE is False or not 0 < t * layer.topk <= DECODE_ASSIGNMENTS:
        return None
    if not all(_is_fp8_block(w) for w in shared):
        return None
    if invariant:
        return INVARIANT_CONFIG, replace(INVARIANT_CONFIG, split_k=2)
    p, device = layer.experts, layer.shared_w1.weight.device
    down = DECODE_DOWN_OVERRIDE or configs.lookup_moe_decode_down(p.hidden, p.inter, device)
    if down is None:
        return None
    return DECODE_OVERRIDE or configs.lookup_moe_decode(p.hidden, p.inter, device), down


def _shared_expert(x: torch.Tensor, layer: Any) -> torch.Tensor:
    w1, w3 = layer.shared_w1, layer.shared_w3
    decode = 0 < x.shape[0] * layer.topk <= DECODE_ASSIGNMENTS
    if decode and _is_fp8_block(w1) and _is_fp8_block(w3):
        act = _shared_gate_up_decode(x, w1, w3, layer.swiglu_limit)
        return linear(act, layer.shared_w2, layer.dtype)
    gate = linear(x, layer.shared_w1, layer.dtype)
    up = linear(x, layer.shared_w3, layer.dtype)
    return linear(swiglu(gate, up, layer.swiglu_limit), layer.shared_w2, layer.dtype)


@triton.jit
def _swiglu_kernel(gate_ptr, up_ptr, act_ptr, n, limit, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gate = tl.load(gate_ptr + offs, mask=mask, other=0.0)
    up = tl.load(up_ptr + offs, mask=mask, other=0.0)
    _swiglu_store(gate, up, 1.0, limit, act_ptr + offs, mask)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """The clamped SwiGLU of the shared expert's gate and up products (gate.float().clamp(max=limit),
    up clamped to +-limit, silu(gate) * up, rounded to their dtype) in one launch (was 7 torch ops: 4096
    tokens x 2304 moved ~0.4 GB through float32 temporaries)."""
    gate, up = gate.contiguous(), up.contiguous()
    act = torch.empty_like(gate)
    n = gate.numel()
    if n:
        block = 2048
        _swiglu_kernel[(triton.cdiv(n, block),)](gate, up, act, n, float(limit), BLOCK=block, num_warps=4)
    return act


def _shared_expert_invariant(x: torch.Tensor, layer: Any) -> torch.Tensor:
    """The shared expert as a one-expert MLP through the grouped kernels at INVARIANT_CONFIG's chain
    (`invariant_tiles`; routing weight 1: exact), the same rounding points as `_shared_expert`."""
    w1, w3, w2 = layer.shared_w1, layer.shared_w3, layer.shared_w2
    if not all(_is_fp8_block(w) for w in (w1, w3, w2)):
        kinds = [getattr(w, "kind", type(w).__name__) for w in (w1, w3, w2)]
        raise ValueError(f"batch-invariant MoE: the shared expert must be ungrouped FP8 linears, got {kinds}")
    t = x.shape[0]
    mlp = _Mlp(w1.weight, w1.scale, w3.weight, w3.scale, w2.weight, w2.scale, True, GROUP, False)
    if t == 0:
        return torch.empty((0, w2.out_features), dtype=x.dtype, device=x.device)
    ones = torch.ones((t, 1), dtype=torch.float32, device=x.device)
    zeros = torch.zeros((t, 1), dtype=torch.int32, device=x.device)
    up, down = invariant_tiles(x, t, 1, False, w2.out_features, w1.out_features)
    return _grouped_mlp(x, ones, zeros, mlp, 1, w1.out_features, layer.swiglu_limit, up, down_cfg=down,
                        row_sums=not x.is_cuda)
