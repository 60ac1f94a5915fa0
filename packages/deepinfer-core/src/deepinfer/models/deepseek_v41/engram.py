"""Engram: hashed n-gram memory added to all residual streams at the entry of its layers (spec §9).

Rows depend on the current token and up to N-1 previous tokens of the same sequence, mapped to the
compressed vocabulary (the checkpoint tokenizer's normalised vocabulary). Image tokens, and the start
of the sequence, block the look-back: that shift and every further one become the pad id. The runtime
builds those n-grams for all rows of a step at once; per Engram layer, one hash op gives their table
rows and one lookup op gathers them for all rows. With row-sharded tables (an active
`deepinfer.distributed` state) each rank holds a block of rows and first fetches the rows it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from deepinfer.config import TextConfig, engram_multipliers, engram_primes
from deepinfer.distributed.engram_shard import EngramShard
from deepinfer.distributed.state import parallel_state
from deepinfer.models.deepseek_v41.linear import Linear, check_scale, make_linear
from deepinfer.models.deepseek_v41.weights import WeightError, Weights
from deepinfer.ops import Ops


@dataclass
class EngramHasher:
    """The compressed vocabulary (n-grams are built from it by the runtime) and the table rows of an
    n-gram for every Engram layer."""

    token_map: torch.Tensor  # [vocab] raw id -> compressed id
    pad_id: int  # compressed id of engram_pad_token_id
    multipliers: list[torch.Tensor]  # per Engram layer: [N] odd int64
    primes: list[torch.Tensor]  # per Engram layer: [N-1, heads]
    offsets: list[torch.Tensor]  # per Engram layer: [N-1, heads], running sums of the primes
    ops: Ops

    @classmethod
    def build(cls, cfg: TextConfig, token_map: Sequence[int], ops: Ops, device: torch.device) -> EngramHasher:
        vocab = max(token_map) + 1
        if vocab != cfg.engram_compressed_vocab_size:
            raise ValueError(
                f"engram_compressed_vocab_size: config says {cfg.engram_compressed_vocab_size}, the "
                f"checkpoint tokenizer normalises to {vocab} ids (the hash multipliers depend on it)"
            )
        n, heads = cfg.engram_max_ngram_size, cfg.engram_n_heads
        primes = engram_primes(cfg.engram_layer_ids, n, heads, cfg.engram_vocab_size)
        mults, ps, offs = [], [], []
        for layer_id, layer_primes in zip(cfg.engram_layer_ids, primes):
            p = torch.tensor(layer_primes, dtype=torch.int64, device=device)  # [N-1, heads]
            flat = p.flatten()
            ps.append(p)
            offs.append((flat.cumsum(0) - flat).view_as(p))
            mults.append(
                torch.tensor(engram_multipliers(layer_id, n, vocab), dtype=torch.int64, device=device)
            )
        tmap = torch.tensor(list(token_map), dtype=torch.int64, device=device)
        return cls(tmap, int(tmap[cfg.engram_pad_token_id]), mults, ps, offs, ops)

    def rows(self, k: int, ngrams: torch.Tensor) -> torch.Tensor:
        """Table rows [T, (N-1)*heads] of the k-th Engram layer."""
        return self.ops.engram_hash(ngrams, self.multipliers[k], self.primes[k], self.offsets[k])


@dataclass
class Engram:
    """One Engram layer: FP8 table, key/value projection and the per-stream sigmoid gate."""

    table: torch.Tensor  # [rows, D] float8_e4m3fn (sharded: this rank's block of rows)
    table_scale: torch.Tensor  # [rows, D/32] UE8M0
    wkv: Linear  # [(m+1)H, heads*D]: m keys then one shared value
    gate_weight: torch.Tensor  # [m, H] = q_weight * k_weight (folded norm weights)
    hidden: int
    m: int
    eps: float
    ops: Ops
    dtype: torch.dtype
    shard: EngramShard | None = None

    @classmethod
    def load(cls, w: Weights, cfg: TextConfig, k: int, ops: Ops, dtype: torch.dtype) -> Engram:
        m, h, d = cfg.hc_mult, cfg.hidden_size, cfg.engram_head_dim
        heads = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
        rows = cfg.engram_rows[k]
        shard = None
        if (par := parallel_state()) is not None:
            shard = par.engram_shard(rows)
            begin, end = par.engram_rows(rows)
            rows = end - begin
        table = w.get("embed.weight", (rows, d))
        if table.dtype != torch.float8_e4m3fn:
            raise WeightError(f"{w.name('embed.weight')}: dtype {table.dtype}, expected F8_E4M3")
        return cls(
            table=table,
            table_scale=check_scale(w, "embed.scale", (rows, d // 32)),
            wkv=make_linear(w, "wkv", ops, dtype, ((m + 1) * h, heads * d)),
            gate_weight=w.get("q_weight", (m, h)).float() * w.get("k_weight", (m, h)).float(),
            hidden=h,
            m=m,
            eps=cfg.rms_norm_eps,
            ops=ops,
            dtype=dtype,
            shard=shard,
        )

    def __call__(
        self, streams: torch.Tensor, rows: torch.Tensor, token_mask: torch.Tensor | None
    ) -> torch.Tensor:
        table, scale = self.table, self.table_scale
        if self.shard is not None:
            table, scale, rows = self.shard.gather(table, scale, rows)
        e = self.ops.engram_lookup(table, scale, rows, self.dtype)
        keys, value = self.wkv(e).split((self.m * self.hidden, self.hidden), dim=-1)
        keys = keys.unflatten(-1, (self.m, self.hidden))
        return self.ops.engram_gate(streams, keys, value, self.gate_weight, token_mask, self.eps)
