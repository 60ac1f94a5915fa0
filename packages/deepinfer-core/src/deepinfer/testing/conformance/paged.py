"""Conformance cases of the layer-level ops over the paged cache (docs/architecture.md, "Layer ops")."""

from __future__ import annotations

import torch

from deepinfer.cache import Codec
from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.ops.reference.cache_quant import QUANT_OPS
from deepinfer.testing.conformance import Case, rand, randint, register

S, L, D, HEADS = 3, 6, 64, 2  # slots, ring entries per slot, entry width, query heads
BLOCKS, E = 5, 4  # paged blocks, entries per block
ROW_SEG = [0, 0, 0, 1, 1]  # five rows: three of sequence 0, two of sequence 1
TABLES = [[3, 1], [4, 2]]

_PRECISIONS = {
    "exact": (Codec("raw", D, torch.float32), Codec("raw", D, torch.float32)),
    "release": (Codec("fp8", D, torch.float32), Codec("nvfp4", D, torch.float32)),
}


def _region(g: torch.Generator, codec: Codec, a: int, e: int, device: torch.device) -> torch.Tensor:
    """A cache region [a, e, nbytes] holding encoded random entries."""
    return codec.encode(torch.randn(a * e, codec.dim, generator=g), QUANT_OPS).view(a, e, -1).to(device)


def _paged_attention_inputs(precision: str, compressed: bool):
    ring_codec, pool_codec = _PRECISIONS[precision]

    def make(device: torch.device, g: torch.Generator):
        t = len(ROW_SEG)
        q = rand(g, t, HEADS, D, device=device)
        kv = rand(g, t, D, device=device)
        ring = _region(g, ring_codec, S, L, device)
        window = randint(g, 0, S * L + t, t, 4, device=device)
        window[:, 0] = -1
        window[-1] = -1  # a row with no window key
        # written rows are never read by `window` here, so the oracle may read the ring afterwards
        window = torch.where((window == 2 * L) | (window == 2 * L + 1), -1, window)
        dest, src = torch.tensor([2 * L, 2 * L + 1], device=device), torch.tensor([4, 1], device=device)
        kwargs = {}
        if compressed:
            topk = randint(g, 0, 2 * E, t, 3, device=device)
            topk[0, 1:] = -1
            kwargs = {"pool": _region(g, pool_codec, BLOCKS, E, device), "pool_codec": pool_codec,
                      "topk": topk, "block_tables": torch.tensor(TABLES, device=device),
                      "row_seg": torch.tensor(ROW_SEG, device=device)}
        return (q, kv, ring, ring_codec, window, dest, src, rand(g, HEADS, device=device), D**-0.5), kwargs

    return make


def _paged_attention_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    q, kv, ring, codec, window, dest, src, sink, scale = args
    encoded = codec.encode(kv, QUANT_OPS)
    torch.testing.assert_close(ring.flatten(0, 1)[dest], encoded[src], atol=0, rtol=0)
    for t in range(q.shape[0]):
        keys = []
        for i in window[t].tolist():
            if i >= 0:
                raw = ring.flatten(0, 1)[i] if i < S * L else encoded[i - S * L]
                keys.append(codec.decode(raw.unsqueeze(0), QUANT_OPS))
        if "pool" in kwargs:
            pool, table = kwargs["pool"], kwargs["block_tables"][kwargs["row_seg"][t]]
            for j in kwargs["topk"][t].tolist():
                if j >= 0:
                    raw = pool[table[j // E], j % E].unsqueeze(0)
                    keys.append(kwargs["pool_codec"].decode(raw, QUANT_OPS))
        buf = torch.cat(keys) if keys else kv.new_zeros(1, D)
        idx = torch.arange(len(keys)).unsqueeze(0) if keys else torch.full((1, 1), -1)
        want = REFERENCE_OPS["sparse_attention_sink"](q[t : t + 1], buf, idx, sink, scale)
        torch.testing.assert_close(out[t : t + 1], want, atol=1e-5, rtol=1e-5)


for _precision in _PRECISIONS:
    for _compressed in (False, True):
        register(Case(
            "sparse_attention_paged", f"{_precision}-{'window+compressed' if _compressed else 'window'}",
            _paged_attention_inputs(_precision, _compressed), _paged_attention_oracle,
            result=lambda out, args, kwargs: (out, args[2]),
        ))


def _topk_inputs(mode: str):
    def make(device: torch.device, g: torch.Generator):
        t, capacity = len(ROW_SEG), 2 * E
        codec = _PRECISIONS["exact"][0] if mode != "release" else Codec("mxfp4", D, torch.float32)
        kwargs = {}
        if mode == "allowed":
            kwargs["allowed"] = (randint(g, 0, 3, t, capacity, device=device) > 0)
        if mode == "candidates":
            kwargs["candidates"] = (2, 2)
        visible = torch.tensor([0, 3, 8, 5, 2], device=device)  # row 0 sees nothing
        return (rand(g, t, HEADS, D, device=device), rand(g, t, HEADS, device=device),
                _region(g, codec, BLOCKS, E, device), codec, torch.tensor(TABLES, device=device),
                torch.tensor(ROW_SEG, device=device), visible, capacity, 4), kwargs

    return make


def _topk_oracle(out: tuple, args: tuple, kwargs: dict) -> None:
    q, w, pool, codec, tables, row_seg, visible, capacity, k = args
    top, mask = out
    assert top.shape == (q.shape[0], k) and (mask is None) == ("candidates" not in kwargs)
    for t in range(q.shape[0]):
        table = tables[row_seg[t]]
        keys = codec.decode(torch.stack([pool[table[j // E], j % E] for j in range(capacity)]), QUANT_OPS)
        scores = REFERENCE_OPS["indexer_logits"](q[t : t + 1], keys, w[t : t + 1])[0]
        ok = torch.arange(capacity) < visible[t]
        if mask is not None:  # candidates (2, 2): the latest visible block and the best other one
            topk_blocks, block = kwargs["candidates"]
            pooled = scores.masked_fill(~ok, -torch.inf).view(-1, block).amax(-1).tolist()
            if int(visible[t]):
                pooled[(int(visible[t]) - 1) // block] = torch.inf
            want = sorted(v for v in pooled if v > -torch.inf)[::-1][:topk_blocks]
            blocks = mask[t].view(-1, block).any(-1)
            got = sorted((pooled[b] for b in range(len(pooled)) if blocks[b]), reverse=True)
            assert got == want, (t, mask[t], want)  # tied blocks may be kept in any order
            assert torch.equal(mask[t], blocks.repeat_interleave(block) & ok), (t, mask[t])
        if "allowed" in kwargs:
            ok &= kwargs["allowed"][t]
        ranked = [j for j in sorted(range(capacity), key=lambda j: -scores[j]) if ok[j]][:k]
        got = [j for j in top[t].tolist() if j >= 0]
        assert top[t].tolist() == got + [-1] * (k - len(got)) and got == sorted(got), (t, top[t])
        assert all(ok[j] for j in got), (t, got)
        # equal scores (relu can make several exactly 0) may be selected in any order
        assert sorted(scores[got].tolist()) == sorted(scores[ranked].tolist()), (t, got, ranked)


for _mode in ("exact", "release", "allowed", "candidates"):
    register(Case("indexer_topk", _mode, _topk_inputs(_mode), _topk_oracle))


def _compressor_inputs(device: torch.device, g: torch.Generator):
    lc = 3
    state = rand(g, S, lc, 2 * D, device=device).view(torch.uint8).contiguous()
    gate_value = rand(g, 4, 2 * D, device=device)
    sources = torch.tensor([[4, 5], [S * lc + 0, S * lc + 1], [S * lc + 2, S * lc + 3]], device=device)
    dest, src = torch.tensor([3, 6], device=device), torch.tensor([3, 2], device=device)
    return (gate_value, state, sources, dest, src), {}


def _compressor_oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    gate_value, state, sources, dest, src = args
    rows = state.flatten(0, 1).view(torch.float32)
    assert torch.equal(rows[dest], gate_value[src])
    everything = torch.cat((rows, gate_value))  # rows 4, 5 are not overwritten (dest 3 and 6 only)
    for m in range(sources.shape[0]):
        gate, value = everything[sources[m]].chunk(2, dim=-1)
        torch.testing.assert_close(out[m], (gate.softmax(0) * value).sum(0), atol=1e-6, rtol=1e-6)


register(Case("compressor_update", "ring+step", _compressor_inputs, _compressor_oracle,
              result=lambda out, args, kwargs: (out, args[1])))


def _write_inputs(codec: Codec):
    def make(device: torch.device, g: torch.Generator):
        pool = torch.zeros(BLOCKS, E, codec.nbytes, dtype=torch.uint8, device=device)
        return (pool, torch.tensor([5, 0, 19], device=device), rand(g, 3, D, device=device), codec), {}

    return make


def _write_oracle(out: None, args: tuple, kwargs: dict) -> None:
    pool, dest, values, codec = args
    want = torch.zeros_like(pool).flatten(0, 1)
    want[dest] = codec.encode(values, QUANT_OPS)
    assert out is None and torch.equal(pool.flatten(0, 1), want)


_CODECS = (Codec("raw", D, torch.bfloat16), Codec("fp8", D, torch.bfloat16), Codec("nvfp4", D, torch.float32),
           Codec("mxfp4", D, torch.float))
for _codec in _CODECS:
    register(Case("cache_write", f"{_codec.format}-{str(_codec.dtype)[6:]}", _write_inputs(_codec),
                  _write_oracle, result=lambda out, args, kwargs: args[0]))
