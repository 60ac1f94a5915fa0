"""Stateful attention == one-shot full-sequence attention, for every layer kind of the tiny configs.

The harness drives only the attention layers (in layer order, sharing one StepState per forward) with
per-layer inputs that depend only on the position, so chunked prefill, decode, multi-token
verification and rollback must reproduce the outputs of a single full-sequence pass.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from deepinfer.cache import KVCache
from deepinfer.config import TextConfig
from deepinfer.models.deepseek_v41.attention import Attention
from deepinfer.models.deepseek_v41.step_state import BoundedReplay, StepState
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import get_ops
from deepinfer.testing.configs import tiny_config

MAX_BACKTRACK = 3
BLOCKS_PER_SEQ = 4


def random_attention_weights(cfg: TextConfig, layer: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    spec = cfg.layers[layer]
    h, d, hid, rq = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size, cfg.q_lora_rank
    g, ro, ni, di = cfg.o_groups, cfg.o_lora_rank, cfg.index_n_heads, cfg.index_head_dim

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / cols**0.5

    def norm(n: int) -> torch.Tensor:
        return 1 + 0.1 * torch.randn(n, generator=gen)

    w = {
        "wq_a.weight": mat(rq, hid), "q_norm.weight": norm(rq), "wq_b.weight": mat(h * d, rq),
        "wkv.weight": mat(d, hid), "kv_norm.weight": norm(d), "wo_a.weight": mat(g * ro, h // g * d),
        "wo_b.weight": mat(hid, g * ro), "attn_sink": torch.randn(h, generator=gen),
    }
    if spec.owns_compressor:
        w |= {"compressor.wkv.weight": mat(d, hid), "compressor.norm.weight": norm(d)}
        if spec.compress_ratio > 1:
            w["compressor.wgate.weight"] = mat(d, hid)
    if spec.owns_index_keys:
        w |= {"indexer.wk.weight": mat(di, d), "indexer.k_norm.weight": norm(di)}
    if spec.owns_indexer_query:
        w |= {"indexer.wq_b.weight": mat(ni * di, rq), "indexer.weights_proj.weight": mat(ni, hid)}
    return w


class Harness:
    """Attention layers of a config over one cache; `step` runs one forward of several segments."""

    def __init__(self, name: str, precision: str = "exact", dtype: torch.dtype = torch.float32,
                 seed: int = 0, seqs: int = 2):
        self.cfg = tiny_config(name).text
        gen = torch.Generator().manual_seed(seed)
        ops = get_ops("reference")
        self.specs = [s for s in self.cfg.layers if s.role != "dspark"]
        self.layers = [Attention(self.cfg, s, random_attention_weights(self.cfg, s.index, gen), ops, dtype)
                       for s in self.specs]
        self.cache = KVCache(self.cfg, 1 + seqs * BLOCKS_PER_SEQ, 1 + seqs, precision, dtype, MAX_BACKTRACK)
        self.dtype = dtype

    def block_table(self, seq: int) -> list[int]:
        return [1 + seq * BLOCKS_PER_SEQ + b for b in range(BLOCKS_PER_SEQ)]

    def step(self, parts: list[tuple[int, int, int]], inputs: list[torch.Tensor],
             replay: BoundedReplay | None = None) -> list[torch.Tensor]:
        """parts: (seq, start, length) per segment; inputs[seq]: [layers, positions, H].
        Returns per layer the output rows [rows, H] in the layer's row layout."""
        batch = ForwardBatch([SequenceSegment(slot=1 + s, block_table=self.block_table(s), start_pos=p,
                                              token_ids=[0] * n) for s, p, n in parts])
        step = StepState.build(batch, self.cfg, self.cache, replay)
        outs = []
        for li, (spec, attn) in enumerate(zip(self.specs, self.layers, strict=True)):
            x_all = torch.cat([inputs[s][li, p : p + n] for s, p, n in parts]).to(self.dtype)
            if spec.index == self.cfg.n_prefill_layer:
                kept = step.enter_consumer_half(x_all)
            rows = step.rows(spec)
            x = x_all[kept] if spec.is_yoco_consumer and kept is not None else x_all
            assert x.shape[0] == rows.count
            outs.append(attn(x, step))
        return outs


def inputs_for(h: Harness, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(len(h.specs), length, h.cfg.hidden_size, generator=gen)


def one_shot(name: str, x: torch.Tensor, **kw) -> list[torch.Tensor]:
    h = Harness(name, seqs=1, **kw)
    return h.step([(0, 0, x.shape[1])], [x])


CONFIGS = ["swa_only", "c2", "c1_yoco", "reindex", "full"]


@pytest.mark.parametrize(
    ("name", "precision"), [(n, "exact") for n in CONFIGS] + [("c2", "release"), ("full", "release")]
)
def test_chunked_prefill_decode_verify_rollback_equal_one_shot(name: str, precision: str) -> None:
    length = 120
    h = Harness(name, precision)
    xs = [inputs_for(h, length, 10), inputs_for(h, length, 11)]
    junk = [inputs_for(h, length, 20), inputs_for(h, length, 21)]
    ref = [one_shot(name, x, precision=precision) for x in xs]

    # (seq, start, length, rejected?) per segment; two sequences at different positions share each step
    schedule = [
        [(0, 0, 7), (1, 0, 13)],
        [(0, 7, 33), (1, 13, 1)],
        [(0, 40, 1), (1, 14, 29)],
        [(0, 41, 4, 2), (1, 43, 3, 1)],  # verification; last 2 / 1 tokens rejected
        [(0, 43, 1), (1, 45, 4, 3)],  # resume after rollback; seq 1 verifies again, rejects 3
        [(0, 44, 76), (1, 46, 74)],
    ]
    worst = 0.0
    for parts in schedule:
        feed = []
        for s, p, n, *rej in parts:
            x = xs[s].clone()
            if rej:  # rejected tokens were fed with inputs that differ from the accepted ones
                x[:, p + n - rej[0] : p + n] = junk[s][:, p + n - rej[0] : p + n]
            feed.append(x)
        outs = h.step([(s, p, n) for s, p, n, *_ in parts], feed)
        for li, out in enumerate(outs):
            row = 0
            for s, p, n, *rej in parts:
                good = n - (rej[0] if rej else 0)
                diff = (out[row : row + good] - ref[s][li][p : p + good]).abs().max().item()
                worst = max(worst, diff)
                row += n
    print(f"{name} {precision}: max abs diff {worst:.2e}")
    assert worst < 1e-5, worst
    assert h.cache.blocks[0].count_nonzero() == 0 and h.cache.slots[0].count_nonzero() == 0  # padding



def test_bf16_chunked_close_to_one_shot() -> None:
    """bf16 compute: chunking changes GEMM shapes, so agreement is to bf16 rounding, not bitwise."""
    h = Harness("full", dtype=torch.bfloat16, seqs=1)
    x = inputs_for(h, 90, 10)
    ref = one_shot("full", x, dtype=torch.bfloat16)
    outs = [h.step([(0, s, n)], [x]) for s, n in ((0, 13), (13, 1), (14, 5), (19, 71))]
    for li, r in enumerate(ref):
        got = torch.cat([o[li] for o in outs])
        assert got.dtype == torch.bfloat16
        assert (got.float() - r.float()).abs().max() < 5e-2, li

# --- SWA bounded replay (YOCO prefill truncation)
#
# Layer inputs here depend only on the position, so a consumer row whose whole window lies inside the
# kept suffix must match the untruncated result exactly, rows whose window crosses the suffix start
# must differ (their window is clipped), and decode after a truncated prefill must match decode after
# a full one.

NAME = "full"  # consumer half from layer 5: Full C1 candidate source, Reindex, Reuse


@cache
def _run(mode: str, keep: int, prompt: int = 60, other: int = 15):
    h = Harness(NAME)
    xs = [inputs_for(h, 100, 1), inputs_for(h, 100, 2)]
    replay = BoundedReplay(mode, keep)
    prefill = h.step([(0, 0, prompt), (1, 0, other)], xs, replay)
    decode = [h.step([(0, prompt + i, 1), (1, other + i, 1)], xs, replay) for i in range(3)]
    verify = h.step([(0, prompt + 3, 4), (1, other + 3, 2)], xs, replay)
    after_rollback = h.step([(0, prompt + 5, 1), (1, other + 5, 1)], xs, replay)
    return h, prefill, [*decode, verify, after_rollback]


def _kept(h: Harness, layer: int, out: torch.Tensor, mode: str, keep: int, lengths=(60, 15)) -> torch.Tensor:
    """The rows of a prefill output that compact mode computes, in its layout."""
    spec = h.specs[layer]
    if not spec.is_yoco_consumer or mode != "mask":
        return out
    rows, start = [], 0
    for n in lengths:
        rows.append(out[start + max(0, n - keep) : start + n])
        start += n
    return torch.cat(rows)


def test_mask_and_compact_identical() -> None:
    keep = 20
    hm, pm, sm = _run("mask", keep)
    _, pc, sc = _run("compact", keep)
    for li in range(len(hm.specs)):
        torch.testing.assert_close(_kept(hm, li, pm[li], "mask", keep), pc[li], rtol=0, atol=0)
    for a, b in zip(sm, sc, strict=True):
        for la, lb in zip(a, b, strict=True):
            torch.testing.assert_close(la, lb, rtol=0, atol=0)


def test_compact_with_keep_covering_prompt_equals_off() -> None:
    _, po, so = _run("off", 140)
    _, pc, sc = _run("compact", 60)
    for a, b in zip([po, *so], [pc, *sc], strict=True):
        for la, lb in zip(a, b, strict=True):
            torch.testing.assert_close(la, lb, rtol=0, atol=0)


def test_window_clipped_to_kept_suffix_only() -> None:
    keep, prompt = 20, 60
    _, po, so = _run("off", keep)
    hm, pm, sm = _run("mask", keep)
    window, start = hm.cfg.sliding_window, prompt - keep
    for li, spec in enumerate(hm.specs):
        diff = (pm[li][:prompt] - po[li][:prompt]).abs().amax(-1)
        if not spec.is_yoco_consumer:
            assert diff.max() == 0
            continue
        assert diff[start + window - 1 :].max() == 0  # window inside the suffix: unchanged
        assert (diff[start : start + window - 1] > 0).all()  # window crosses the suffix start: clipped
    # the decode window never reaches before the suffix (keep >= W + max_backtrack)
    for a, b in zip(so, sm, strict=True):
        for la, lb in zip(a, b, strict=True):
            torch.testing.assert_close(la, lb, rtol=0, atol=0)


def test_keep_smaller_than_window_plus_backtrack_rejected() -> None:
    h = Harness(NAME)
    xs = [inputs_for(h, 20, 1)]
    with pytest.raises(ValueError, match="sliding_window \\+ max_backtrack"):
        h.step([(0, 0, 20)], xs, BoundedReplay("compact", h.cfg.sliding_window + 2))


# --- causality and selection


@pytest.mark.parametrize("name", ["c2", "full"])
def test_no_visibility_of_future_tokens_or_compressed_entries(name: str) -> None:
    """Changing token p changes nothing before p; for ratio 2 the half-complete group of an even
    position t = 2j (entry j needs token 2j + 1) must stay invisible to t."""
    length = 40
    h = Harness(name, seqs=1)
    x = inputs_for(h, length, 3)
    base = Harness(name, seqs=1).step([(0, 0, length)], [x])
    for p in (9, 21, 22):
        y = x.clone()
        y[:, p] += 1.0
        outs = Harness(name, seqs=1).step([(0, 0, length)], [y])
        for li, (a, b) in enumerate(zip(base, outs, strict=True)):
            assert torch.equal(a[:p], b[:p]), (p, li)
            assert not torch.equal(a[p], b[p]), (p, li)


def test_topk_only_visible_entries_and_latest_candidate_block() -> None:
    h = Harness("full", seqs=1)
    length = 150
    x = inputs_for(h, length, 4)
    batch = ForwardBatch([SequenceSegment(slot=1, block_table=h.block_table(0), start_pos=0,
                                          token_ids=[0] * length)])
    step = StepState.build(batch, h.cfg, h.cache)
    cfg, pos = h.cfg, torch.arange(length)
    for li, (spec, attn) in enumerate(zip(h.specs, h.layers, strict=True)):
        if spec.index == cfg.n_prefill_layer:
            step.enter_consumer_half(x[li])
        attn(x[li], step)
        if spec.owns_indexer_query:
            sel = step.topk.value
            visible = (pos + 1) // spec.compress_ratio
            assert (sel < visible.unsqueeze(-1)).all()
            assert ((sel >= 0).sum(-1) == visible.clamp(max=cfg.index_topk)).all()  # full when enough visible
        if spec.is_candidate_source:
            mask = step.candidates.value
            block = cfg.candidate_block_size
            for t in range(length):
                n = int(visible[t])
                latest = (n - 1) // block * block
                assert mask[t, latest:n].all()  # the latest block is always a candidate
                assert not mask[t, n:].any()
                kept = mask[t, :n].unflatten(0, (-1, block)).any(-1) if n % block == 0 else None
                if kept is not None:
                    assert int(kept.sum()) == min(cfg.candidate_topk_blocks, n // block)
        if spec.restricted_to_candidates:
            sel = step.topk.value
            cand = step.candidates.value
            assert cand.gather(1, sel.clamp(min=0))[sel >= 0].all()


def test_candidate_blocks_keep_the_best_and_the_latest() -> None:
    from deepinfer.ops.reference.indexer import candidate_blocks

    inf = float("inf")
    scores = torch.tensor([[5.0, 1, 0, 0, 9, 0, -3, -4, -2, -inf, -inf, -inf]])
    mask = candidate_blocks(scores, torch.tensor([9]), topk_blocks=2, block=2)
    # blocks by max: [5, 0, 9, -3, -2(latest, forced), -inf]; keep 2 = latest + block 2
    assert mask[0].nonzero().flatten().tolist() == [4, 5, 8]


# --- construction errors name the tensor


@pytest.mark.parametrize(
    ("drop", "reshape"), [("compressor.wgate.weight", None), (None, "indexer.wk.weight")]
)
def test_bad_attention_weights_name_the_tensor(drop: str | None, reshape: str | None) -> None:
    from deepinfer.models.deepseek_v41.weights import WeightError, Weights

    cfg = tiny_config("full").text
    spec = cfg.layers[2]  # Full C2: compressor with gate, indexer keys and query
    w = {f"layers.2.attn.{k}": v for k, v in random_attention_weights(cfg, 2, torch.Generator()).items()}
    if drop:
        del w[f"layers.2.attn.{drop}"]
    if reshape:
        w[f"layers.2.attn.{reshape}"] = w[f"layers.2.attn.{reshape}"][:-1]
    with pytest.raises(WeightError, match=f"layers.2.attn.{drop or reshape}"):
        Attention(cfg, spec, Weights(w, "layers.2.attn."), get_ops("reference"), torch.float32)
