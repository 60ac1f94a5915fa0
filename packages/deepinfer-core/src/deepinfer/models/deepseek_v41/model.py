"""DeepSeek-V4.1 text model: the whole forward, top to bottom (model spec §11).

    streams = 4 copies of the token embedding, carried pre = one-hot(0) (None: see mhc.py)
    for each layer:
        Engram layers add hashed n-gram memory to the streams
        DSpark target layers record the mean of the streams
        attention sub-layer and MoE sub-layer, each wrapped in shifted mHC
        (at the YOCO boundary: hand the shared input to the consumer KV sources, and in bounded
        replay restrict the consumer half to the kept rows)
    final collapse, norm, LM head

Attention (all CSA2 layer kinds, the per-forward StepState and the caches) lives in attention.py /
step_state.py / metadata.py; this file only wires the blocks together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.engram import Engram, EngramHasher
from deepinfer.models.deepseek_v41.linear import make_linear
from deepinfer.models.deepseek_v41.mhc import HyperConnection, initial_streams
from deepinfer.models.deepseek_v41.moe import MoE
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops

# Attention(cfg, spec, weights under "layers.{i}.attn.", ops, dtype) -> callable (x [T, H], step) -> [T, H]
AttentionFactory = Callable[[TextConfig, LayerSpec, Weights, Ops, torch.dtype], Any]


@dataclass
class Block:
    """One backbone layer (or DSpark block): [Engram] -> mHC(attention) -> mHC(MoE)."""

    spec: LayerSpec
    attn_hc: HyperConnection
    attn_norm: torch.Tensor
    attn: Any
    ffn_hc: HyperConnection
    ffn_norm: torch.Tensor
    moe: MoE
    engram: Engram | None
    engram_index: int | None  # position in cfg.engram_layer_ids

    # The sub-layer sequence, shared by the backbone forward and the DSpark draft blocks.
    def attn_input(self, streams: torch.Tensor, pre: torch.Tensor | None) -> torch.Tensor:
        """Normed attention input [T, H]: RMSNorm(mHC collapse of the streams)."""
        return self.attn_hc.collapse_norm(streams, pre, self.attn_norm)

    def attn_residual(self, y: torch.Tensor, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expand the attention output back into the streams -> (streams, carried pre)."""
        return self.attn_hc.residual(y, streams)

    def ffn(
        self, streams: torch.Tensor, pre: torch.Tensor | None, image_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MoE sub-layer wrapped in shifted mHC -> (streams, carried pre)."""
        x = self.ffn_hc.collapse_norm(streams, pre, self.ffn_norm)
        return self.ffn_hc.residual(self.moe(x, image_mask), streams)

    @classmethod
    def load(
        cls,
        w: Weights,
        cfg: TextConfig,
        spec: LayerSpec,
        attention: AttentionFactory,
        ops: Ops,
        dtype: torch.dtype,
    ) -> Block:
        h = cfg.hidden_size
        dspark = spec.role == "dspark"
        n_experts = cfg.dspark_n_routed_experts if dspark else cfg.n_routed_experts
        topk = cfg.dspark_num_experts_per_tok if dspark else cfg.num_experts_per_tok
        k = cfg.engram_layer_ids.index(spec.index) if spec.is_engram else None
        return cls(
            spec=spec,
            attn_hc=HyperConnection.load(w, "hc_attn", cfg, ops),
            attn_norm=w.get("attn_norm.weight", (h,)),
            attn=attention(cfg, spec, w.sub("attn."), ops, dtype),
            ffn_hc=HyperConnection.load(w, "hc_ffn", cfg, ops),
            ffn_norm=w.get("ffn_norm.weight", (h,)),
            moe=MoE.load(w.sub("ffn."), cfg, n_experts, topk, ops, dtype),
            engram=Engram.load(w.sub("engram."), cfg, k, ops, dtype) if k is not None else None,
            engram_index=k,
        )


@dataclass
class TokenInputs:
    """Per-row inputs of one forward besides the ids (rows in segment order)."""

    ids: torch.Tensor  # [T] int64
    image_mask: torch.Tensor | None = None  # [T] bool: image tokens (bias_vl routing, no Engram)
    ngrams: torch.Tensor | None = None  # [T, N] compressed-id n-grams (Engram models)


@dataclass
class ModelOutput:
    hidden: torch.Tensor  # [T_out, H] final-normed hidden states (compact replay: kept rows only)
    target_features: torch.Tensor | None  # [T_out, n_targets * H] DSpark target features (mean of streams)


class DeepseekV41Model:
    def __init__(
        self,
        cfg: TextConfig,
        weights: Mapping[str, torch.Tensor],
        attention: AttentionFactory,
        ops: Ops,
        dtype: torch.dtype,
        engram_token_map: list[int] | None = None,
    ) -> None:
        w = Weights(weights)
        h = cfg.hidden_size
        self.cfg, self.ops, self.dtype = cfg, ops, dtype
        self.embed = w.get("embed.weight", (cfg.vocab_size, h))
        self.norm = w.get("norm.weight", (h,))
        self.head = make_linear(w, "head", ops, torch.float32, (cfg.vocab_size, h), operand_dtype=dtype)
        backbone = cfg.layers[: cfg.num_hidden_layers]
        self.blocks = [Block.load(w.sub(f"{s.prefix}."), cfg, s, attention, ops, dtype) for s in backbone]
        self.hasher = None
        if cfg.has_engram:
            if engram_token_map is None:
                raise ValueError("Engram layers need the compressed vocabulary of the checkpoint tokenizer")
            self.hasher = EngramHasher.build(cfg, engram_token_map, ops, self.embed.device)
        self.consumer_start = cfg.n_prefill_layer

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids].to(self.dtype)

    def forward(self, inputs: TokenInputs, step: Any) -> ModelOutput:
        cfg = self.cfg
        streams, pre = initial_streams(self.embed_tokens(inputs.ids), cfg.hc_mult)
        image_mask = inputs.image_mask
        text_mask = None if image_mask is None else ~image_mask
        engram_rows = {}
        if self.hasher is not None:
            engram_rows = {k: self.hasher.rows(k, inputs.ngrams) for k in range(len(cfg.engram_layer_ids))}
        targets = []

        for blk in self.blocks:
            if blk.engram is not None:
                streams = blk.engram(streams, engram_rows[blk.engram_index], text_mask)
            if blk.spec.is_dspark_target:
                targets.append(streams.mean(dim=1))

            x = blk.attn_input(streams, pre)
            if blk.spec.index == self.consumer_start:
                # YOCO: the consumer half's long-range KV comes from this input, for every row; with
                # compact bounded replay the consumer half then runs on the kept rows only
                rows = step.enter_consumer_half(x)
                if rows is not None:
                    streams, x = streams[rows], x[rows]
                    pre = None if pre is None else pre[rows]
                    image_mask = None if image_mask is None else image_mask[rows]
                    targets = [t[rows] for t in targets]
            streams, pre = blk.attn_residual(blk.attn(x, step), streams)
            streams, pre = blk.ffn(streams, pre, image_mask)

        hidden = self.blocks[-1].ffn_hc.collapse_norm(streams, pre, self.norm)
        return ModelOutput(hidden, torch.cat(targets, dim=-1) if targets else None)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head, float32 logits (the head is stored F32 or BF16; kernel backends may hold an F32 head
        in BF16 for BF16 models, as the official engine: `prepare_linear`'s operand_dtype)."""
        return self.head(hidden)
