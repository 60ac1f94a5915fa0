"""Warp-specialised sparse attention decode (Gluon, Hopper): 64 heads x 512 over raw bf16 key rows.

The decode case of `attention._attention` for a raw bf16 cache of flat rows (`sparse_attention_sink`):
one program per (query row, key split), three partitions of one CTA:
* a producer warpgroup gathers the selected key rows (and first the row's q) into a ring of STAGES
  shared-memory buffers with asynchronous copies (cp.async, 16 bytes a lane), each buffer's copies
  completing on its `ready` mbarrier; a buffer is refilled once both consumers released it on its `empty`
  mbarrier. The copies of the next tiles are in flight while the consumers compute, which Triton's own
  pipeliner does not do (it issues a tile's copy after the products of the tile before);
* two consumer warpgroups, each with half of the 512 value channels ([64, 256] float32 accumulator),
  taking the score tiles in turn: each computes the [64, BLOCK_N] scores of every other tile (q and the
  keys from shared memory, wgmma) and their softmax, and hands the probabilities (bf16), the new running
  maximum and the row sums to the other through shared memory; both add every tile's P.V to their half.
  A tile's softmax needs the maximum after the tile before (the other's), so the softmaxes run one after
  the other while one warpgroup's score products overlap the other's softmax and P.V. Session 10's
  consumers each computed every score tile (q, 64 KB, read from shared memory twice a tile): 46.6 -> 41.4
  us at B = 128 (docs/performance.md).
Padding keys (-1) are zero-filled rows with a -inf score. The partial results (normalised output and
log2-sum-exp2 per split) have the layout of `attention._attention_kernel`'s, merged by its combine kernel;
with one split the sink is applied here.
With `pdl` the kernel is launched with programmatic dependent launch: its CTAs may start (barriers set up)
while the kernel before it still runs; every partition waits for that kernel (griddepcontrol.wait) before it
reads q, the ids or the rows, or writes anything, then lets the kernel after it launch (launch_dependents:
the grid is one wave, so its CTAs can only take SMs this grid leaves free, and they wait in turn).
GPU only (Gluon does not run in the interpreter); the default-mode path only (not batch-invariant).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

HEADS, DIM = gl.constexpr(64), gl.constexpr(512)
_ROWS = gl.constexpr(8)  # key rows a producer copy instruction covers (the 128-byte swizzle spans 8 rows)


@gluon.jit
def _grid_dependency(PDL: gl.constexpr):
    """PDL: waits until the kernel before has finished and its writes are visible (before this partition's
    first read or write of global memory), then signals that the kernel after may launch."""
    if PDL:
        gdc_wait()
        if PDL == 2:
            gdc_launch_dependents()


@gluon.jit
def _producer(q_ptr, q_stride_h, kv_ptr, kv_stride, idx_ptr, lo, hi, q_smem, kv_smem, ids_smem, q_ready,
              ready, empty, PDL: gl.constexpr):
    """Copies q, then the key rows of the tiles of lo..hi, into the ring; each thread's copies arrive on the
    buffer's barrier when they land. A tile's ids are loaded one tile ahead (their latency then runs under
    the wait for a free buffer) and go through shared memory to the threads that copy their rows."""
    STAGES: gl.constexpr = kv_smem.shape[0]
    BLOCK_N: gl.constexpr = kv_smem.shape[1]
    ROWS: gl.constexpr = _ROWS
    PW: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [PW, 1], [1, 0])
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [PW], [0])
    cols = gl.arange(0, DIM, layout=gl.SliceLayout(0, layout))
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    tn = gl.arange(0, BLOCK_N, layout=flat)
    _grid_dependency(PDL)
    ids_next = gl.load(idx_ptr + lo + tn, mask=lo + tn < hi, other=-1)
    for r0 in gl.static_range(0, HEADS, ROWS):
        async_copy.async_copy_global_to_shared(
            q_smem.slice(r0, ROWS, dim=0), q_ptr + (r0 + r)[:, None] * q_stride_h + cols[None, :])
    async_copy.mbarrier_arrive(q_ready, increment_count=False)
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    for i in range(n_tiles):
        st = i % STAGES
        gl.thread_barrier()  # every thread has read the ids of the tile before
        ids_smem.store(ids_next)
        gl.thread_barrier()
        n = lo + (i + 1) * BLOCK_N + tn
        ids_next = gl.load(idx_ptr + n, mask=n < hi, other=-1)
        mbarrier.wait(empty.index(st), ((i // STAGES) & 1) ^ 1)  # the first pass finds every buffer free
        buf = kv_smem.index(st)
        for r0 in gl.static_range(0, BLOCK_N, ROWS):
            ids = ids_smem.slice(r0, ROWS).load(gl.SliceLayout(1, layout))
            rows = kv_ptr + gl.maximum(ids, 0).to(gl.int64)[:, None] * kv_stride + cols[None, :]
            async_copy.async_copy_global_to_shared(buf.slice(r0, ROWS, dim=0), rows, mask=(ids >= 0)[:, None])
        async_copy.mbarrier_arrive(ready.index(st), increment_count=False)


@gluon.jit
def _finish(acc, m_i, l_i, split, sink_ptr, out_ptr, out_stride_h, part_ptr, lse_ptr, COL0: gl.constexpr):
    """Stores value channels COL0.. of the result: normalised output and log2-sum-exp2 (split) or the output
    with the sink applied."""
    o_layout: gl.constexpr = acc.type.layout
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    h = gl.arange(0, HEADS, layout=rows_o)
    d = COL0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, o_layout))
    m_o, l_o = gl.convert_layout(m_i, rows_o), gl.convert_layout(l_i, rows_o)
    if split:
        lse = gl.where(l_o > 0, m_o + gl.log2(l_o), -float("inf"))
        o = gl.where(l_o[:, None] > 0, acc / l_o[:, None], 0.0)
        gl.store(part_ptr + h[:, None] * DIM + d[None, :], o)
        if COL0 == 0:
            gl.store(lse_ptr + h, lse)
    else:
        sink = gl.load(sink_ptr + h).to(gl.float32) * 1.4426950408889634
        top = gl.maximum(m_o, sink)
        a = gl.exp2(m_o - top)
        o = acc * (a / (l_o * a + gl.exp2(sink - top)))[:, None]
        gl.store(out_ptr + h[:, None] * out_stride_h + d[None, :], o.to(out_ptr.dtype.element_ty))


@gluon.jit
def _publish(s, live, m_prev, scale_log2, p_slot, m_slot, sum_slot, p_ready):
    """Softmax of a score tile from the running maximum m_prev: its probabilities (bf16), new maximum and
    row sums, also stored in a slot of shared memory for the other consumer (P read there by wgmma)."""
    logits = gl.where(live[None, :], s * scale_log2, -float("inf"))
    m_new = gl.maximum(m_prev, gl.max(logits, axis=1))
    p = gl.exp2(logits - m_new[:, None])
    row_sum = gl.sum(p, axis=1)
    pb = p.to(gl.bfloat16)
    p_slot.store(pb)
    m_slot.store(m_new)
    sum_slot.store(row_sum)
    fence_async_shared()  # P written by ordinary stores, read by the other warpgroup's wgmma
    gl.thread_barrier()
    mbarrier.arrive(p_ready)
    return m_new, pb, row_sum


@gluon.jit
def _accumulate(acc, l_i, m_from, m_to, row_sum, p, v, empty):
    """acc, l_i (at maximum m_from) moved to m_to, plus one tile's P.V and row sums; the tile's buffer is
    released when the products are done."""
    alpha = gl.exp2(m_from - m_to)
    l_i = l_i * alpha + row_sum
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    acc = warpgroup_mma(p, v, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    gl.thread_barrier()
    mbarrier.arrive(empty)
    return acc, l_i


@gluon.jit
def _consumer(q_smem, kv_smem, q_ready, ready, empty, shared, idx_ptr, lo, hi, split, scale_log2, sink_ptr,
              out_ptr, out_stride_h, part_ptr, lse_ptr, PDL: gl.constexpr, ME: gl.constexpr):
    """One warpgroup of two sharing their score products: it computes the scores of every other tile
    (tiles ME, ME + 2, ...) for both, and accumulates all tiles into its 256 value channels. Tile i's
    softmax needs the maximum after tile i - 1 (the other's), handed over with its probabilities and row
    sums through `shared` slots, so the softmaxes run in turn while the score products of both overlap;
    the softmax goes first (the other waits on it), then this warpgroup's P.V of tiles i - 1 and i."""
    p_smem, m_smem, sum_smem, p_ready = shared
    STAGES: gl.constexpr = kv_smem.shape[0]
    BLOCK_N: gl.constexpr = kv_smem.shape[1]
    SLOTS: gl.constexpr = p_smem.shape[0]
    HALF: gl.constexpr = DIM // 2
    COL0: gl.constexpr = ME * HALF
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    keys: gl.constexpr = gl.SliceLayout(0, s_layout)
    m_i = gl.full([HEADS], -1.0e30, gl.float32, layout=rows_s)  # finite: no NaN from an all-padding tile
    l_i = gl.zeros([HEADS], gl.float32, layout=rows_s)
    acc = gl.zeros([HEADS, HALF], gl.float32, layout=o_layout)
    s_zero = gl.zeros([HEADS, BLOCK_N], gl.float32, layout=s_layout)
    _grid_dependency(PDL)  # before the ids' loads
    mbarrier.wait(q_ready, 0)
    fence_async_shared()
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    tn = gl.arange(0, BLOCK_N, layout=keys)
    if (ME == 0) and (n_tiles > 0):  # tile 0 has no tile before it
        live = gl.load(idx_ptr + lo + tn, mask=lo + tn < hi, other=-1) >= 0
        mbarrier.wait(ready.index(0), 0)
        fence_async_shared()
        kv = kv_smem.index(0)
        s = warpgroup_mma(q_smem, kv.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        m_new, pb, row_sum = _publish(s, live, m_i, scale_log2, p_smem.index(0), m_smem.index(0),
                                      sum_smem.index(0), p_ready.index(0))
        acc, l_i = _accumulate(acc, l_i, m_i, m_new, row_sum, gl.convert_layout(pb, p_layout),
                               kv.slice(COL0, HALF, dim=1), empty.index(0))
        m_i = m_new
    start: gl.constexpr = 2 - ME
    n = lo + start * BLOCK_N + tn
    live_next = gl.load(idx_ptr + n, mask=n < hi, other=-1) >= 0
    for i in range(start, n_tiles, 2):
        live = live_next  # loaded two tiles ahead: no wait on them
        n = lo + (i + 2) * BLOCK_N + tn
        live_next = gl.load(idx_ptr + n, mask=n < hi, other=-1) >= 0
        st, sp, ps, slot = i % STAGES, (i - 1) % STAGES, (i - 1) % SLOTS, i % SLOTS
        mbarrier.wait(ready.index(st), (i // STAGES) & 1)
        fence_async_shared()  # the rows came through the generic proxy; wgmma reads through the async one
        kv = kv_smem.index(st)
        s = warpgroup_mma(q_smem, kv.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(p_ready.index(ps), ((i - 1) // SLOTS) & 1)  # the other's tile i - 1
        m_prev = m_smem.index(ps).load(rows_s)
        sum_prev = sum_smem.index(ps).load(rows_s)
        s = warpgroup_mma_wait(0, deps=[s])
        m_new, pb, row_sum = _publish(s, live, m_prev, scale_log2, p_smem.index(slot), m_smem.index(slot),
                                      sum_smem.index(slot), p_ready.index(slot))
        mbarrier.wait(ready.index(sp), ((i - 1) // STAGES) & 1)  # long done; orders its rows before our reads
        fence_async_shared()
        acc, l_i = _accumulate(acc, l_i, m_i, m_prev, sum_prev, p_smem.index(ps),
                               kv_smem.index(sp).slice(COL0, HALF, dim=1), empty.index(sp))
        acc, l_i = _accumulate(acc, l_i, m_prev, m_new, row_sum, gl.convert_layout(pb, p_layout),
                               kv.slice(COL0, HALF, dim=1), empty.index(st))
        m_i = m_new
    last = n_tiles - 1
    if (n_tiles > 0) & (last % 2 != ME):  # the other's last tile
        sp, ps = last % STAGES, last % SLOTS
        mbarrier.wait(p_ready.index(ps), (last // SLOTS) & 1)
        m_prev = m_smem.index(ps).load(rows_s)
        sum_prev = sum_smem.index(ps).load(rows_s)
        mbarrier.wait(ready.index(sp), (last // STAGES) & 1)
        fence_async_shared()
        acc, l_i = _accumulate(acc, l_i, m_i, m_prev, sum_prev, p_smem.index(ps),
                               kv_smem.index(sp).slice(COL0, HALF, dim=1), empty.index(sp))
        m_i = m_prev
    _finish(acc, m_i, l_i, split, sink_ptr, out_ptr, out_stride_h, part_ptr, lse_ptr, COL0)


@gluon.jit
def _consumer_low(q_smem, kv_smem, q_ready, ready, empty, shared, idx_ptr, lo, hi, split, scale_log2,
                  sink_ptr, out_ptr, out_stride_h, part_ptr, lse_ptr, PDL: gl.constexpr):
    _consumer(q_smem, kv_smem, q_ready, ready, empty, shared, idx_ptr, lo, hi, split, scale_log2, sink_ptr,
              out_ptr, out_stride_h, part_ptr, lse_ptr, PDL, 0)


@gluon.jit
def _consumer_high(q_smem, kv_smem, q_ready, ready, empty, shared, idx_ptr, lo, hi, split, scale_log2,
                   sink_ptr, out_ptr, out_stride_h, part_ptr, lse_ptr, PDL: gl.constexpr):
    _consumer(q_smem, kv_smem, q_ready, ready, empty, shared, idx_ptr, lo, hi, split, scale_log2, sink_ptr,
              out_ptr, out_stride_h, part_ptr, lse_ptr, PDL, 1)


@gluon.jit(do_not_specialize=["n_splits"])
def _ws_decode_kernel(q_ptr, q_stride_t, q_stride_h, kv_ptr, kv_stride, idx_ptr, idx_stride, K,
                      keys_per_split, n_splits, scale_log2, sink_ptr, out_ptr, out_stride_t, out_stride_h,
                      part_ptr, lse_ptr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PW: gl.constexpr,
                      REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, PDL: gl.constexpr):
    t = gl.program_id(0)
    s = gl.program_id(1)
    lo = s * keys_per_split
    hi = gl.minimum(lo + keys_per_split, K)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEADS, DIM], gl.bfloat16)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, DIM], gl.bfloat16)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, DIM], q_layout)
    kv_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, DIM], kv_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ids_smem = gl.allocate_shared_memory(idx_ptr.dtype.element_ty, [BLOCK_N],
                                         gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    # a tile's probabilities, maximum and row sums handed to the other consumer (4 slots: a slot is
    # written again two own tiles later, after the other has published tile + 3, so done reading it)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEADS, BLOCK_N], gl.bfloat16)
    row_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [4, HEADS, BLOCK_N], p_layout)
    m_smem = gl.allocate_shared_memory(gl.float32, [4, HEADS], row_layout)
    sum_smem = gl.allocate_shared_memory(gl.float32, [4, HEADS], row_layout)
    p_ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(4):
        mbarrier.init(p_ready.index(i), count=1)
    mbarrier.init(q_ready, count=32 * PW)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * PW)  # each producer thread arrives when its copies land
        mbarrier.init(empty.index(i), count=2)  # each consumer warpgroup
    t64 = t.to(gl.int64)
    q_row = q_ptr + t64 * q_stride_t
    idx_row = idx_ptr + t64 * idx_stride
    out_row = out_ptr + t64 * out_stride_t
    split_row = (t64 * n_splits + s) * HEADS
    part_row = part_ptr + split_row * DIM
    lse_row = lse_ptr + split_row
    consumer_args = (q_smem, kv_smem, q_ready, ready, empty, (p_smem, m_smem, sum_smem, p_ready), idx_row, lo,
                     hi, n_splits > 1, scale_log2, sink_ptr, out_row, out_stride_h, part_row, lse_row, PDL)
    producer_args = (q_row, q_stride_h, kv_ptr, kv_stride, idx_row, lo, hi, q_smem, kv_smem, ids_smem,
                     q_ready, ready, empty, PDL)
    gl.warp_specialize([(_consumer_low, consumer_args), (_consumer_high, consumer_args),
                        (_producer, producer_args)], [4, PW], [REGS, PRODUCER_REGS])


def supported(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor) -> bool:
    """Whether the warp-specialised kernel serves this decode: bf16 64 x 512 rows on a Hopper GPU."""
    return (q.is_cuda and q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16
            and tuple(q.shape[1:]) == (64, 512) and kv.dim() == 2 and kv.shape[-1] == 512
            and kv.stride(-1) == 1 and q.stride(-1) == 1 and idx.stride(-1) == 1 and idx.shape[1] > 0
            and torch.cuda.get_device_capability(q.device)[0] == 9)


def decode(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor, scale_log2: float,
           out: torch.Tensor, part: torch.Tensor, lse: torch.Tensor, keys_per_split: int, splits: int,
           tiles: tuple[int, int, int, int], pdl: int = 0) -> None:
    """Attention of q [T, 64, 512] over rows kv[idx[t]] (idx [T, K], -1 none) in `splits` key ranges of
    keys_per_split (a multiple of the tile's keys): into out (one split, sink applied) or part [T, splits,
    64, 512] / lse [T, splits, 64] (float32, merged by the caller). tiles: (keys a tile, ring buffers,
    producer warps, registers a consumer thread (the producer gets what is left of 504)).
    pdl: 0 an ordinary launch; 1 programmatic dependent launch, the kernel after launching when this one
    ends; 2 the same, the kernel after launching once every CTA has waited (`_grid_dependency`)."""
    block_n, stages, pw, regs = tiles
    t, k = idx.shape
    launch = {"launch_pdl": True} if pdl else {}
    _ws_decode_kernel[(t, splits)](
        q, q.stride(0), q.stride(1), kv, kv.stride(0), idx, idx.stride(0), k, keys_per_split, splits,
        scale_log2, sink, out, out.stride(0), out.stride(1), part, lse,
        BLOCK_N=block_n, STAGES=stages, PW=pw, REGS=regs, PRODUCER_REGS=504 - 2 * regs, PDL=pdl,
        num_warps=4, **launch,
    )
