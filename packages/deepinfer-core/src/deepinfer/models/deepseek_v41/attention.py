"""CSA2 attention of one DeepSeek-V4.1 layer (model spec §4-§6), stateful over the paged cache.

Interface (the step protocol and the ops it calls: docs/architecture.md):
    attn = Attention(cfg, spec, weights, ops, dtype)    # weights: Weights view at "layers.{i}.attn."
    y = attn(x, step)                                    # x [rows, H] normed input -> [rows, H]
`step` is the forward's StepState: it says which rows this layer computes, holds the cache and
carries the compressed stream / top-k / candidate masks from source layers to Reuse layers.

Every layer attends, with one softmax and a per-head sink, over its sliding window (own `wkv`,
keys (t - W, t]) plus, on compressed layers, the top-k selected entries of its KV source's stream.
Keys and values are the same vector; RoPE sits on its last 64 channels and is undone on the output
(queries and outputs rotate in place: only those channels move; the compressed latents are copied, the
index keys read them unrotated).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.compressor import Compressor
from deepinfer.models.deepseek_v41.indexer import Indexer
from deepinfer.models.deepseek_v41.linear import make_fused_linear, make_linear
from deepinfer.models.deepseek_v41.rope import Rope
from deepinfer.models.deepseek_v41.step_state import StepState
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import Ops


class Attention:
    def __init__(
        self,
        cfg: TextConfig,
        spec: LayerSpec,
        weights: Weights | Mapping[str, torch.Tensor],
        ops: Ops,
        dtype: torch.dtype,
    ):
        if spec.role == "dspark":
            raise ValueError("DSpark blocks attend over target-feature keys; Attention does not build them")
        if spec.owns_index_keys and not spec.owns_compressor:
            raise NotImplementedError(f"layer {spec.index}: an index-K source must also be a KV source")
        w = weights if isinstance(weights, Weights) else Weights(weights)
        h, d, groups = cfg.num_attention_heads, cfg.head_dim, cfg.o_groups
        self.cfg, self.spec, self.ops, self.dtype = cfg, spec, ops, dtype
        self.heads, self.dim, self.window, self.eps = h, d, cfg.sliding_window, cfg.rms_norm_eps
        # wq_a and wkv read the same input: one stacked weight, one launch (the parts serve DSpark's
        # separate query / key projections)
        self.w_in = make_fused_linear(
            w, [("wq_a", (cfg.q_lora_rank, cfg.hidden_size)), ("wkv", (d, cfg.hidden_size))], ops, dtype
        )
        self.wq_a, self.wkv = self.w_in.parts
        self.q_norm = w.get("q_norm.weight", (cfg.q_lora_rank,))
        q_up = [("wq_b", (h * d, cfg.q_lora_rank))]
        if spec.owns_indexer_query:  # the indexer's query projection reads the same latent
            q_up.append(("indexer.wq_b", (cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)))
        self.w_q_up = make_fused_linear(w, q_up, ops, dtype)
        self.wq_b = self.w_q_up.parts[0]
        self.kv_norm = w.get("kv_norm.weight", (d,))
        # grouped: output group g (o_lora_rank rows) reads only head group g's h/groups*d channels
        self.wo_a = make_linear(w, "wo_a", ops, dtype, (groups * cfg.o_lora_rank, h // groups * d), groups)
        self.wo_b = make_linear(w, "wo_b", ops, dtype, (cfg.hidden_size, groups * cfg.o_lora_rank))
        self.sink = w.get("attn_sink", (h,)).float()
        device = self.q_norm.device
        self.rope = Rope.for_layer(cfg, spec, device)
        owns = spec.owns_compressor
        self.compressor = Compressor(cfg, spec, w.sub("compressor."), ops, dtype) if owns else None
        has_indexer = spec.owns_index_keys or spec.owns_indexer_query
        self.indexer = Indexer(cfg, spec, w.sub("indexer."), ops, dtype) if has_indexer else None

    def __call__(self, x: torch.Tensor, step: StepState) -> torch.Tensor:
        spec, ops, meta = self.spec, self.ops, step.meta
        rows = step.rows(spec)
        if x.shape[0] != rows.count:
            raise ValueError(f"layer {spec.index}: {x.shape[0]} input rows, the step computes {rows.count}")
        angles = step.angles(self.rope, rows.positions)
        q_a, kv_a = self.w_in(x)
        q_latent = self.ops.rms_norm(q_a, self.q_norm, self.eps)
        q_heads, *index_q = self.w_q_up(q_latent)
        q = self._rotate_queries(q_heads, angles)
        kv = self._window_kv(kv_a, angles)
        ring = step.cache.window(spec.index)
        compressed = {}
        if spec.compress_ratio:
            if self.compressor is not None:
                self._compress(x, step)
            if spec.owns_indexer_query:
                self.indexer.select(index_q[0], x, angles, rows, step)
            step.check_stream(spec)
            pool = step.cache.compressed_kv(spec.kv_source)
            compressed = {"pool": pool.data, "pool_codec": pool.codec, "topk": step.selection(spec),
                          "block_tables": meta.block_tables, "row_seg": rows.row_seg}
        o = ops.sparse_attention_paged(
            q, kv, ring.data, ring.codec, rows.window, rows.ring_dest, rows.ring_src, self.sink,
            self.dim**-0.5, **compressed,
        )
        return self.project_output(o, angles)

    # The three projections are public so DSpark blocks (own key sources) reuse them.
    def query(self, x: torch.Tensor, angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(query latent c [n, q_lora_rank], rotated queries [n, heads, head_dim])."""
        q_latent = self.ops.rms_norm(self.wq_a(x), self.q_norm, self.eps)
        return q_latent, self._rotate_queries(self.wq_b(q_latent), angles)

    def window_kv(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Sliding-window key (= value) [n, head_dim], rotated, before the cache codec."""
        return self._window_kv(self.wkv(x), angles)

    def _rotate_queries(self, q: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        # in place: the projection's output (or its part of the fused one) is read by nothing else
        return self.ops.rope_interleaved(q.unflatten(-1, (self.heads, self.dim)), angles, inplace=True)

    def _window_kv(self, kv_a: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm_rope(kv_a, self.kv_norm, self.eps, angles)

    def project_output(self, o: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Attention output [n, heads, head_dim] -> [n, H]: undo RoPE, grouped wo_a, then wo_b."""
        o = self.ops.rope_interleaved(o, angles, inverse=True, inplace=True)  # o is read by nothing else
        return self.wo_b(self.wo_a(o.flatten(1)))

    def _compress(self, x: torch.Tensor, step: StepState) -> None:
        """Append this step's complete groups (KV and index keys) to the KV source's paged pool."""
        spec, ops = self.spec, self.ops
        if spec.is_yoco_consumer:  # YOCO: consumer KV comes from the shared input of all rows
            if step.shared_input is None:
                raise RuntimeError("call step.enter_consumer_half(x_all) at the first YOCO consumer layer")
            x = step.shared_input
        new = step.meta.compression[spec.compress_ratio]
        state = step.cache.compressor_state(spec.index) if spec.compress_ratio > 1 else None
        latent = self.compressor(x, new, state)
        angles = step.angles(self.rope, new.entry_positions)  # entry j sits at its group's first token
        kv_pages, key_pages = step.cache.compressed_kv(spec.index), step.cache.index_keys(spec.index)
        ops.cache_write(kv_pages.data, new.pool_dest, ops.rope_interleaved(latent, angles), kv_pages.codec)
        ops.cache_write(key_pages.data, new.pool_dest, self.indexer.keys(latent, angles), key_pages.codec)
        step.compressed_by = spec.index
