"""Stateful attention == one-shot full-sequence attention, for every layer kind of the tiny configs.

The harness drives only the attention layers (in layer order, sharing one StepState per forward) with
per-layer inputs that depend only on the position, so chunked prefill, decode, multi-token
verification and rollback must reproduce the outputs of a single full-sequence pass.
"""

from __future__ import annotations

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

    def __init__(self, name: str, precision: str = "exact", dtype=torch.float32, seed: int = 0, seqs: int = 2):
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


@pytest.mark.parametrize("name", CONFIGS)
def test_chunked_prefill_decode_verify_rollback_equal_one_shot(name: str) -> None:
    length = 120
    h = Harness(name)
    xs = [inputs_for(h, length, 10), inputs_for(h, length, 11)]
    junk = [inputs_for(h, length, 20), inputs_for(h, length, 21)]
    ref = [one_shot(name, x) for x in xs]

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
    print(f"{name}: max abs diff {worst:.2e}")
    assert worst < 1e-5, worst
