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
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from deepinfer.cache import KVCache
from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.linear import Linear, make_linear
from deepinfer.models.deepseek_v41.metadata import RowSet, Staging
from deepinfer.models.deepseek_v41.mhc import initial_streams
from deepinfer.models.deepseek_v41.model import AttentionFactory, Block, DeepseekV41Model
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops

if TYPE_CHECKING:
    from deepinfer.models.deepseek_v41.graphs import DraftGraphs


@dataclass
class DraftOutput:
    hidden: torch.Tensor  # [n, B, H] collapsed output of the last block, before its norm
    normed: torch.Tensor  # [n, B, H] after mtp.{last}.norm
    base_logits: torch.Tensor  # [n, B, V] float32: head(normed)


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
        self.markov_head = make_linear(last, "markov_head.head", ops, torch.float32, (cfg.vocab_size, r))
        self.confidence_proj = make_linear(last, "confidence_head.proj", ops, torch.float32, (1, h + r))
        self.block_size = cfg.dspark_block_size
        self.noise_id = cfg.dspark_noise_token_id
        self.window = cfg.sliding_window
        self.staging = Staging(main.embed.device)
        self.graphs: DraftGraphs | None = None  # set by the runtime per cache (CUDA graphs on)

    # --- context keys, written on every main-model forward

    def context_features(self, target_features: torch.Tensor) -> torch.Tensor:
        """F = RMSNorm(main_proj T; main_norm): [n, n_targets * H] -> [n, H]."""
        return self.ops.rms_norm(self.main_proj(target_features), self.main_norm, self.cfg.rms_norm_eps)

    def write_context(self, cache: KVCache, rows: RowSet, features: torch.Tensor) -> None:
        """Key the target features of the output rows (`rows`: the last layer's row set) into every
        block's window ring, at the ring rows that set's own keys go to."""
        f = self.context_features(features)[rows.ring_src]
        positions = rows.positions[rows.ring_src]
        for blk in self.blocks:
            ring = cache.window(blk.spec.index)
            kv = blk.attn.window_kv(f, blk.attn.rope.angles(positions))
            self.ops.cache_write(ring.data, rows.ring_dest, kv, ring.codec)

    # --- draft forward

    def draft(
        self, cache: KVCache, slots: Sequence[int], anchors: Sequence[int], golden: Sequence[int]
    ) -> DraftOutput:
        """Run the draft blocks for n sequences: slot, golden-token position a and golden token id each
        (through a CUDA graph of the batch bucket when the runtime set `graphs`)."""
        if self.graphs is not None and (out := self.graphs.draft(cache, slots, anchors, golden)) is not None:
            return out
        ids, positions, window = self.staging.upload(self.draft_arrays(cache, slots, anchors, golden))
        return self.draft_forward(cache, ids, positions, window)

    def draft_forward(
        self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, window: torch.Tensor
    ) -> DraftOutput:
        """The device work of a draft step (what a graph records) on draft_arrays' uploaded inputs."""
        bsz = self.block_size
        n = ids.shape[0] // bsz
        streams, pre = initial_streams(self.main.embed_tokens(ids), self.cfg.hc_mult)
        for blk in self.blocks:
            x = blk.attn_input(streams, pre)
            streams, pre = blk.attn_residual(self._attend(blk, cache, x, positions, window), streams)
            streams, pre = blk.ffn(streams, pre, None)

        hidden = self.blocks[-1].ffn_hc.collapse(streams, pre)
        normed = self.ops.rms_norm(hidden, self.norm, self.cfg.rms_norm_eps)
        logits = self.main.logits(normed)
        return DraftOutput(hidden.view(n, bsz, -1), normed.view(n, bsz, -1), logits.view(n, bsz, -1))

    def draft_arrays(
        self, cache: KVCache, slots: Sequence[int], anchors: Sequence[int], golden: Sequence[int],
        num_seqs: int | None = None,
    ) -> list[np.ndarray]:
        """Host inputs [ids [n*B], positions [n*B], window keys [n*B, W + B]]: each slot sees its
        sequence's context keys [a - W, a - 1] (ring rows) and its whole draft block (step rows).
        `num_seqs`: padded with padding sequences (slot 0, anchor 0: no context keys) to that many."""
        bsz, w = self.block_size, self.window
        ring = cache.window(self.blocks[0].spec.index)
        ring_len, ring_rows = ring.length, ring.data.shape[0] * ring.length
        pad = (num_seqs or len(slots)) - len(slots)
        slot_arr = np.asarray([*slots, *[0] * pad], dtype=np.int64)
        anchor = np.asarray([*anchors, *[0] * pad], dtype=np.int64)
        ids = np.full((len(slot_arr), bsz), self.noise_id, dtype=np.int64)
        ids[:, 0] = [*golden, *[0] * pad]
        positions = anchor[:, None] + np.arange(bsz)
        ctx = anchor[:, None] - w + np.arange(w)  # [n, W] context positions
        ctx_rows = np.where(ctx >= 0, slot_arr[:, None] * ring_len + ctx % ring_len, -1)
        block_rows = ring_rows + np.arange(len(slot_arr) * bsz).reshape(-1, bsz)
        keys = np.concatenate((ctx_rows, block_rows), axis=1)  # [n, W + B]
        return [ids.ravel(), positions.ravel(), np.repeat(keys, bsz, axis=0)]

    def _attend(
        self, blk: Block, cache: KVCache, x: torch.Tensor, positions: torch.Tensor, window: torch.Tensor
    ) -> torch.Tensor:
        """The backbone's SWA attention path over the draft key set; drafts write no cache."""
        attn, ring = blk.attn, cache.window(blk.spec.index)
        angles = attn.rope.angles(positions)
        _, q = attn.query(x, angles)
        none = window.new_empty(0)
        o = self.ops.sparse_attention_paged(
            q, attn.window_kv(x, angles), ring.data, ring.codec, window, none, none, attn.sink, attn.dim**-0.5
        )
        return attn.project_output(o, angles)

    # --- heads

    def markov(self, prev_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """First-order correction: (logits [..., V] float32, embedding [..., r]) of the previous tokens."""
        e = self.markov_embed[prev_tokens].to(self.dtype)
        return self.markov_head(e), e

    def confidence(
        self, out: DraftOutput, markov_embedding: torch.Tensor, source: Literal["raw", "normed"] = "raw"
    ) -> torch.Tensor:
        """Acceptance logits [n, B]: proj . [h ; e] with h the raw collapse (release) or the normed state."""
        h = out.hidden if source == "raw" else out.normed
        feats = torch.cat((h.float(), markov_embedding.float()), dim=-1)
        return self.confidence_proj(feats).squeeze(-1)
