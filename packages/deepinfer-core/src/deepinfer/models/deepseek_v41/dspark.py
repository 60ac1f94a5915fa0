"""DSpark draft model (`mtp.0..`): target-feature context keys and the draft blocks' forward (spec §10.2).

The main model's forward hands over the target features T_p (mean of the streams at the DSpark target
layers' attention input) of every row; F_p = RMSNorm(main_proj T_p) is keyed by each block's own
wkv/kv_norm and stored in that block's window ring. A draft step for a sequence whose golden token
(the token just produced, not yet fed to the main model) sits at position a runs the blocks in order
on [golden, noise, ...] at positions a .. a+B-1; every slot attends to the context keys of
[a - W, a - 1], all B in-block keys (bidirectional) and the sink. A speculative-decoding plugin
drives it through `draft()` and the head pieces (`base_logits`, `markov`, `confidence`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F

from deepinfer.cache import KVCache
from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.attention import Attention
from deepinfer.models.deepseek_v41.linear import Linear, make_linear
from deepinfer.models.deepseek_v41.mhc import initial_streams
from deepinfer.models.deepseek_v41.model import AttentionFactory, Block, DeepseekV41Model
from deepinfer.models.deepseek_v41.step_state import Rows
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.models.interface import SequenceSegment
from deepinfer.ops import Ops


@dataclass
class DraftOutput:
    hidden: torch.Tensor  # [n, B, H] collapsed output of the last block, before its norm
    normed: torch.Tensor  # [n, B, H] after mtp.{last}.norm
    base_logits: torch.Tensor  # [n, B, V] float32: head(normed)


def _window_kv(attn: Attention, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Window key (= value) of a DSpark block's attention: RoPE(RMSNorm(wkv x; kv_norm)), before the codec."""
    return attn.ops.rope_interleaved(attn.ops.rms_norm(attn.wkv(x), attn.kv_norm, attn.eps), angles)


class DSpark:
    def __init__(
        self,
        cfg: TextConfig,
        weights: Mapping[str, torch.Tensor],
        main: DeepseekV41Model,
        attention: AttentionFactory,
    ) -> None:
        w = Weights(weights)
        h, r = cfg.hidden_size, cfg.dspark_markov_rank
        ops, dtype = main.ops, main.dtype
        self.cfg, self.main, self.ops, self.dtype = cfg, main, ops, dtype
        specs = cfg.layers[cfg.num_hidden_layers :]

        def block_attention(
            cfg: TextConfig, spec: LayerSpec, aw: Weights, ops: Ops, dtype: torch.dtype
        ) -> Any:
            # the same tensors and math pieces as a sliding-window layer; only the key set differs
            return attention(cfg, replace(spec, role="swa"), aw, ops, dtype)

        self.blocks = [Block.load(w.sub(f"{s.prefix}."), cfg, s, block_attention, ops, dtype) for s in specs]
        first, last = w.sub(f"{specs[0].prefix}."), w.sub(f"{specs[-1].prefix}.")
        n_targets = len(cfg.dspark_target_layer_ids)
        self.main_proj: Linear = make_linear(first, "main_proj", ops, dtype, (h, n_targets * h))
        self.main_norm = first.get("main_norm.weight", (h,))
        self.norm = last.get("norm.weight", (h,))
        self.markov_embed = last.get("markov_head.embed.weight", (cfg.vocab_size, r))
        self.markov_head = last.get("markov_head.head.weight", (cfg.vocab_size, r))
        self.confidence_proj = last.get("confidence_head.proj.weight", (1, h + r))
        self.block_size = cfg.dspark_block_size
        self.noise_id = cfg.dspark_noise_token_id
        self.window = cfg.sliding_window

    # --- context keys, written on every main-model forward

    def context_features(self, target_features: torch.Tensor) -> torch.Tensor:
        """F = RMSNorm(main_proj T; main_norm): [n, n_targets * H] -> [n, H]."""
        return self.ops.rms_norm(self.main_proj(target_features), self.main_norm, self.cfg.rms_norm_eps)

    def write_context(
        self, cache: KVCache, segs: Sequence[SequenceSegment], rows: Rows, features: torch.Tensor
    ) -> None:
        """Key the target features of the output rows into every block's window ring."""
        f = self.context_features(features)
        for blk in self.blocks:
            ring = cache.window(blk.spec.index)
            kv = _window_kv(blk.attn, f, blk.attn.rope.angles(rows.positions))
            encoded = ring.codec.encode(kv, ring.ops)
            for (begin, end), seg in zip(rows.bounds, segs):
                begin = max(begin, end - ring.length)  # older rows would collide in the ring
                ring.write(seg.slot, rows.positions[begin:end], encoded[begin:end])

    # --- draft forward

    def draft(
        self, cache: KVCache, slots: Sequence[int], anchors: Sequence[int], golden: Sequence[int]
    ) -> DraftOutput:
        """Run the draft blocks for n sequences: slot, golden-token position a and golden token id each."""
        cfg, ops, dev = self.cfg, self.ops, self.main.embed.device
        n, bsz = len(slots), self.block_size
        ids = torch.full((n, bsz), self.noise_id, dtype=torch.int64, device=dev)
        ids[:, 0] = torch.tensor(list(golden), dtype=torch.int64, device=dev)
        offs = torch.arange(bsz, device=dev)
        positions = (torch.tensor(list(anchors), dtype=torch.int64, device=dev).unsqueeze(1) + offs).flatten()
        streams, pre = initial_streams(self.main.embed_tokens(ids.flatten()), cfg.hc_mult)

        for blk in self.blocks:
            mix = blk.attn_hc(streams)
            x = ops.rms_norm(blk.attn_hc.collapse(streams, pre), blk.attn_norm, cfg.rms_norm_eps)
            streams = blk.attn_hc.expand(self._attend(blk, cache, x, positions, slots, anchors), streams, mix)
            pre = mix.pre
            mix = blk.ffn_hc(streams)
            x = ops.rms_norm(blk.ffn_hc.collapse(streams, pre), blk.ffn_norm, cfg.rms_norm_eps)
            streams = blk.ffn_hc.expand(blk.moe(x), streams, mix)
            pre = mix.pre

        hidden = self.blocks[-1].ffn_hc.collapse(streams, pre)
        normed = ops.rms_norm(hidden, self.norm, cfg.rms_norm_eps)
        logits = self.main.logits(normed)
        return DraftOutput(hidden.view(n, bsz, -1), normed.view(n, bsz, -1), logits.view(n, bsz, -1))

    def _attend(
        self,
        blk: Block,
        cache: KVCache,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: Sequence[int],
        anchors: Sequence[int],
    ) -> torch.Tensor:
        """Each slot attends to its sequence's context keys [a - W, a - 1] and the whole draft block."""
        attn, ops, bsz, dev = blk.attn, self.ops, self.block_size, x.device
        ring = cache.window(blk.spec.index)
        angles = attn.rope.angles(positions)
        q_latent = ops.rms_norm(attn.wq_a(x), attn.q_norm, attn.eps)
        q = ops.rope_interleaved(attn.wq_b(q_latent).unflatten(-1, (attn.heads, attn.dim)), angles)
        in_block = ring.codec.round_trip(_window_kv(attn, x, angles), ops)[1]
        buffers, index_rows, base = [], [], 0
        for i, (slot, a) in enumerate(zip(slots, anchors)):
            ctx_pos = torch.arange(max(a - self.window, 0), a, device=dev)
            buffers += [ring.load(slot, ctx_pos), in_block[i * bsz : (i + 1) * bsz]]
            keys = torch.arange(base, base + len(ctx_pos) + bsz, device=dev)
            index_rows.append(F.pad(keys, (0, self.window - len(ctx_pos)), value=-1).expand(bsz, -1))
            base += len(ctx_pos) + bsz
        o = ops.sparse_attention_sink(q, torch.cat(buffers), torch.cat(index_rows), attn.sink, attn.dim**-0.5)
        o = ops.rope_interleaved(o, angles, inverse=True).flatten(1).chunk(len(attn.wo_a), dim=-1)
        return attn.wo_b(torch.cat([wo(og) for wo, og in zip(attn.wo_a, o)], dim=-1))

    # --- heads

    def markov(self, prev_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """First-order correction: (logits [..., V] float32, embedding [..., r]) of the previous tokens."""
        e = self.markov_embed[prev_tokens].to(self.dtype)
        return self.ops.dense_linear(e, self.markov_head, self.dtype).float(), e

    def confidence(
        self, out: DraftOutput, markov_embedding: torch.Tensor, source: Literal["raw", "normed"] = "raw"
    ) -> torch.Tensor:
        """Acceptance logits [n, B]: proj . [h ; e] with h the raw collapse (release) or the normed state."""
        h = out.hidden if source == "raw" else out.normed
        feats = torch.cat((h.float(), markov_embedding.float()), dim=-1)
        return self.ops.dense_linear(feats, self.confidence_proj, torch.float32).squeeze(-1)
