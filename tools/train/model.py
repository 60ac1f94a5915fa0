"""Full-sequence, differentiable DeepSeek-V4.1 target model for training (model spec §4-§11).

The runtime (`deepinfer.models.deepseek_v41`) is a stateful engine over quantised weights and a paged
cache; training needs every position of a batch of equal-length sequences at once and gradients. This
model computes the same function (checked against the runtime's logits on the same weights, exact cache
precision, float32) with parameters named like the release tensors, so export is a per-tensor
quantisation. Routed experts are stacked per layer (`...ffn.experts.w1` [E, I, H]) and computed densely
(every expert on every token, weighted by the routing weights, zero for unselected experts): cheaper than
gathering at these sizes. The pure-torch reference ops supply the pieces they share (norm, RoPE, mHC,
Engram gate and hash, candidate blocks, clamped SwiGLU).

The lightning indexer's top-k selection has no gradient; `forward` also returns, per index source, the KL
from the layer's own dense attention over the visible compressed entries (detached) to the indexer's
score distribution, which trains the indexer (computed in training mode only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer.checkpoint.inventory import iter_inventory
from deepinfer.config import LayerSpec, ModelConfig, TextConfig
from deepinfer.models.deepseek_v41.engram import EngramHasher
from deepinfer.models.deepseek_v41.rope import Rope
from deepinfer.ops import get_ops
from deepinfer.ops.reference.engram import engram_gate
from deepinfer.ops.reference.indexer import candidate_blocks
from deepinfer.ops.reference.mhc import hc_coefficients, hc_collapse, hc_expand
from deepinfer.ops.reference.moe import swiglu_clamped
from deepinfer.ops.reference.norm import rms_norm
from deepinfer.ops.reference.rotary import rope_interleaved

EXPERT_KEYS = ("w1", "w3", "w2")


def parameter_shapes(c: TextConfig) -> dict[str, tuple[int, ...]]:
    """Logical (dequantised) shape of every trainable tensor; routed experts stacked per layer."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in iter_inventory(c):
        if spec.kind == "scale" or ".ffn.experts." in spec.name:
            continue
        shapes[spec.name] = (spec.shape[0], spec.shape[1] * 2) if spec.kind == "fp4" else spec.shape
    for s in c.layers:
        n_exp = c.dspark_n_routed_experts if s.dspark_block is not None else c.n_routed_experts
        h, inter = c.hidden_size, c.moe_intermediate_size
        shapes[f"{s.prefix}.ffn.experts.w1"] = (n_exp, inter, h)
        shapes[f"{s.prefix}.ffn.experts.w3"] = (n_exp, inter, h)
        shapes[f"{s.prefix}.ffn.experts.w2"] = (n_exp, h, inter)
    return shapes


def initial_value(name: str, shape: tuple[int, ...], c: TextConfig, gen: torch.Generator) -> torch.Tensor:
    """Training initialisation: unit norms, small projections (output projections scaled by depth),
    mHC close to identity mixing (comb diagonal) with equal pre/post weights."""
    depth = c.num_hidden_layers + c.num_nextn_predict_layers
    m = c.hc_mult
    if name.endswith(("norm.weight", "q_weight", "k_weight")):
        return torch.ones(shape)
    if name.endswith(("attn_sink", "gate.bias", "gate.bias_vl")):
        return torch.zeros(shape)
    if name.endswith("_base"):
        base = torch.zeros(shape)
        base[2 * m :] = (torch.eye(m) * 6 - 3).flatten()  # comb logits: near-identity after Sinkhorn
        return base
    if name.endswith("_scale"):
        return torch.full(shape, 0.1)
    if name.endswith("_fn"):
        return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    if name.endswith("confidence_head.proj.weight"):
        return torch.zeros(shape)
    if name.endswith(("engram.embed.weight", "markov_head.embed.weight")) or name == "embed.weight":
        return torch.randn(shape, generator=gen)
    fan_in = shape[-1]
    std = 1.0 / math.sqrt(fan_in)
    if name.endswith(("wo_b.weight", ".w2", "shared_experts.w2.weight", "markov_head.head.weight")):
        std /= math.sqrt(2 * depth)
    if name == "head.weight":
        std = 0.5 / math.sqrt(fan_in)
    return torch.randn(shape, generator=gen) * std


@dataclass
class StreamState:
    """Cross-layer compressed-attention state of one forward (the nemo-style carried state)."""

    kv: torch.Tensor | None = None  # [B, M, D] rotated compressed KV of the current KV source
    index_keys: torch.Tensor | None = None  # [B, M, d_I]
    ratio: int = 0
    selected: torch.Tensor | None = None  # [B, T, M] bool: the current top-k selection
    candidates: torch.Tensor | None = None  # [B, T, M] bool: candidate mask of the candidate source
    shared_input: torch.Tensor | None = None  # YOCO: normed input of the first consumer layer
    aux: list[torch.Tensor] = field(default_factory=list)


class DeepseekV41Train(nn.Module):
    def __init__(self, config: ModelConfig, engram_token_map: Sequence[int] | None = None, seed: int = 0):
        super().__init__()
        self.config, self.cfg = config, config.text
        c = self.cfg
        gen = torch.Generator().manual_seed(seed)
        self.names = list(parameter_shapes(c))
        for name, shape in parameter_shapes(c).items():
            self.register_parameter(_attr(name), nn.Parameter(initial_value(name, shape, c, gen)))
        self.hasher = None
        if c.has_engram:
            if engram_token_map is None:
                raise ValueError("Engram layers need the tokenizer's compressed vocabulary")
            self.hasher = EngramHasher.build(
                c, engram_token_map, get_ops("reference", "cpu"), torch.device("cpu")
            )
        self.ropes = {s.index: Rope.for_layer(c, s) for s in c.layers}
        self._loads: dict[str, torch.Tensor] = {}  # expert selection counts of the last training forward
        self.backbone = c.layers[: c.num_hidden_layers]

    # --- parameters by release name

    def p(self, name: str) -> torch.Tensor:
        return getattr(self, _attr(name))

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return {n: self.p(n) for n in self.names}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n in self.names:
                self.p(n).copy_(tensors[n])

    def to(self, *args, **kwargs):
        """nn.Module.to, plus the Engram hash tables and RoPE frequencies (plain tensors)."""
        out = super().to(*args, **kwargs)
        device = self.p("embed.weight").device
        if self.hasher is not None:
            h = self.hasher
            h.token_map = h.token_map.to(device)
            h.multipliers = [t.to(device) for t in h.multipliers]
            h.primes = [t.to(device) for t in h.primes]
            h.offsets = [t.to(device) for t in h.offsets]
        self.ropes = {k: Rope(r.freqs.to(device), r.key) for k, r in self.ropes.items()}
        return out

    # --- forward

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """ids [B, T] (position 0 = first token) -> (final-normed hidden [B, T, H], DSpark target
        features [B, T, n_targets * H] or None, indexer auxiliary losses)."""
        c = self.cfg
        b, t = ids.shape
        streams, pre = self.initial(ids)
        positions = torch.arange(t, device=ids.device)
        rows = self.engram_rows(ids) if self.hasher is not None else None
        st = StreamState()
        targets = []
        for spec in self.backbone:
            if spec.is_engram:
                streams = self.engram(spec, streams, rows[c.engram_layer_ids.index(spec.index)])
            if spec.is_dspark_target:
                targets.append(streams.mean(dim=1).view(b, t, -1))
            x, mix = self.attn_input(spec, streams, pre)
            if spec.index == c.n_prefill_layer:
                st.shared_input = x
            y = self.attention(spec, x.view(b, t, -1), positions, st).flatten(0, 1)
            streams, pre = self.residual(y, streams, mix)
            streams, pre = self.ffn(spec, streams, pre)
        hidden = self.final_norm(streams, pre).view(b, t, -1)
        feats = torch.cat(targets, dim=-1) if targets else None
        return hidden, feats, st.aux

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.float(), self.p("head.weight").float())

    def initial(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Streams [B*T, m, H] = embedding copies, carried pre = one-hot(0)."""
        e = self.p("embed.weight")[ids.flatten()].float()
        pre = torch.zeros(e.shape[0], self.cfg.hc_mult, device=e.device)
        pre[:, 0] = 1
        return e.unsqueeze(1).expand(-1, self.cfg.hc_mult, -1), pre

    def final_norm(self, streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        return rms_norm(hc_collapse(streams, pre), self.p("norm.weight"), self.cfg.rms_norm_eps)

    # --- mHC sub-layer plumbing (shifted variant)

    def _mix(self, prefix: str, streams: torch.Tensor):
        c = self.cfg
        return hc_coefficients(
            streams,
            self.p(f"{prefix}_fn"),
            self.p(f"{prefix}_base"),
            self.p(f"{prefix}_scale"),
            c.hc_sinkhorn_iters,
            c.hc_eps,
            c.rms_norm_eps,
        )

    def attn_input(self, spec: LayerSpec, streams: torch.Tensor, pre: torch.Tensor):
        mix = self._mix(f"{spec.prefix}.hc_attn", streams)
        x = rms_norm(
            hc_collapse(streams, pre), self.p(f"{spec.prefix}.attn_norm.weight"), self.cfg.rms_norm_eps
        )
        return x, mix

    @staticmethod
    def residual(y: torch.Tensor, streams: torch.Tensor, mix) -> tuple[torch.Tensor, torch.Tensor]:
        pre, post, comb = mix
        return hc_expand(y.float(), streams, post, comb), pre

    def ffn(self, spec: LayerSpec, streams: torch.Tensor, pre: torch.Tensor):
        mix = self._mix(f"{spec.prefix}.hc_ffn", streams)
        x = rms_norm(
            hc_collapse(streams, pre), self.p(f"{spec.prefix}.ffn_norm.weight"), self.cfg.rms_norm_eps
        )
        return self.residual(self.moe(spec, x), streams, mix)

    # --- Engram

    def engram_rows(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Per Engram layer: table rows [B*T, (N-1)*heads] of each token's n-gram (pad before the start)."""
        h, n = self.hasher, self.cfg.engram_max_ngram_size
        comp = h.token_map[ids]
        shifted = [comp] + [F.pad(comp[:, :-s], (s, 0), value=h.pad_id) for s in range(1, n)]
        ngrams = torch.stack(shifted, dim=-1).flatten(0, 1)
        return [h.rows(k, ngrams) for k in range(len(self.cfg.engram_layer_ids))]

    def engram(self, spec: LayerSpec, streams: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        p, c = spec.prefix, self.cfg
        e = self.p(f"{p}.engram.embed.weight")[rows.flatten()].view(rows.shape[0], -1)
        kv = F.linear(e, self.p(f"{p}.engram.wkv.weight"))
        keys, value = kv.split((c.hc_mult * c.hidden_size, c.hidden_size), dim=-1)
        w = self.p(f"{p}.engram.q_weight").float() * self.p(f"{p}.engram.k_weight").float()
        return engram_gate(streams, keys.unflatten(-1, (c.hc_mult, -1)), value, w, None, c.rms_norm_eps)

    # --- MoE

    def moe(self, spec: LayerSpec, x: torch.Tensor) -> torch.Tensor:
        p, c = f"{spec.prefix}.ffn", self.cfg
        topk = c.dspark_num_experts_per_tok if spec.dspark_block is not None else c.num_experts_per_tok
        weights, ids = self.route(p, x, topk)
        lim = c.swiglu_limit
        w1, w3, w2 = (self.p(f"{p}.experts.{k}") for k in EXPERT_KEYS)
        n_exp, inter, h = w1.shape
        gate = F.linear(x, w1.reshape(n_exp * inter, h)).view(-1, n_exp, inter)
        up = F.linear(x, w3.reshape(n_exp * inter, h)).view(-1, n_exp, inter)
        dense = torch.zeros(x.shape[0], n_exp, device=x.device).scatter(1, ids, weights)
        act = (swiglu_clamped(gate, up, lim) * dense.unsqueeze(-1)).to(gate.dtype)
        routed = F.linear(act.flatten(1), w2.permute(1, 0, 2).reshape(h, n_exp * inter))
        shared = swiglu_clamped(
            F.linear(x, self.p(f"{p}.shared_experts.w1.weight")),
            F.linear(x, self.p(f"{p}.shared_experts.w3.weight")),
            lim,
        )
        shared_out = F.linear(shared.to(routed.dtype), self.p(f"{p}.shared_experts.w2.weight"))
        if self.training:
            self._loads[p] = torch.bincount(ids.flatten(), minlength=n_exp)
        return routed + shared_out

    def route(self, p: str, x: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """sqrtsoftplus scores, selection by score + bias (no gradient), weights normalised x route scale."""
        with torch.autocast(x.device.type, enabled=False):
            scores = torch.sqrt(F.softplus(F.linear(x.float(), self.p(f"{p}.gate.weight").float())))
        ids = (scores + self.p(f"{p}.gate.bias").float()).topk(topk, dim=-1).indices
        w = scores.gather(-1, ids)
        return w / (w.sum(-1, keepdim=True) + 1e-20) * self.cfg.routed_scaling_factor, ids

    def update_router_bias(self, rate: float) -> None:
        """Auxiliary-loss-free balancing: raise the bias of under-used experts, lower over-used ones."""
        with torch.no_grad():
            for p, load in self._loads.items():
                delta = rate * torch.sign(load.float().mean() - load.float())
                self.p(f"{p}.gate.bias").add_(delta)
                self.p(f"{p}.gate.bias_vl").copy_(self.p(f"{p}.gate.bias"))
        self._loads.clear()

    # --- attention

    def query(
        self, spec: LayerSpec, x: torch.Tensor, angles: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> (query latent [B, T, r_q], rotated queries [B, T, heads, D])."""
        p, c = f"{spec.prefix}.attn", self.cfg
        latent = rms_norm(
            F.linear(x, self.p(f"{p}.wq_a.weight")), self.p(f"{p}.q_norm.weight"), c.rms_norm_eps
        )
        q = F.linear(latent, self.p(f"{p}.wq_b.weight")).unflatten(-1, (c.num_attention_heads, c.head_dim))
        return latent, _rope(q, angles)

    def window_kv(self, spec: LayerSpec, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        p, c = f"{spec.prefix}.attn", self.cfg
        return _rope(
            rms_norm(F.linear(x, self.p(f"{p}.wkv.weight")), self.p(f"{p}.kv_norm.weight"), c.rms_norm_eps),
            angles,
        )

    def project_output(self, spec: LayerSpec, o: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """o [B, T, heads, D] -> [B, T, H]: undo RoPE, grouped wo_a, wo_b."""
        p, c = f"{spec.prefix}.attn", self.cfg
        o = _rope(o, angles, inverse=True).flatten(-2)
        wo_a = self.p(f"{p}.wo_a.weight")
        y = torch.cat(
            [F.linear(xg, wg) for xg, wg in zip(o.chunk(c.o_groups, -1), wo_a.chunk(c.o_groups))], -1
        )
        return F.linear(y, self.p(f"{p}.wo_b.weight"))

    def attention(
        self, spec: LayerSpec, x: torch.Tensor, positions: torch.Tensor, st: StreamState
    ) -> torch.Tensor:
        c = self.cfg
        rope = self.ropes[spec.index]
        angles = rope.angles(positions)
        latent, q = self.query(spec, x, angles)
        kv = self.window_kv(spec, x, angles)
        scale = c.head_dim**-0.5
        logits = torch.einsum("bthd,bsd->bhts", q, kv).float() * scale
        logits = logits.masked_fill(~_window_mask(positions, c.sliding_window), -torch.inf)
        keys = [kv]
        if spec.compress_ratio:
            if spec.owns_compressor:
                self.compress(spec, st.shared_input.view_as(x) if spec.is_yoco_consumer else x, rope, st)
            comp = torch.einsum("bthd,bmd->bhtm", q, st.kv).float() * scale
            visible = torch.arange(st.kv.shape[1], device=x.device) < ((positions + 1) // st.ratio).unsqueeze(
                -1
            )
            if spec.owns_indexer_query:
                self.select(spec, latent, x, angles, visible, comp, st)
            logits = torch.cat((logits, comp.masked_fill(~st.selected.unsqueeze(1), -torch.inf)), dim=-1)
            keys.append(st.kv)
        sink = self.p(f"{spec.prefix}.attn.attn_sink").float().view(1, -1, 1, 1).expand(*logits.shape[:3], 1)
        probs = torch.cat((logits, sink), dim=-1).softmax(dim=-1)[..., :-1]
        o = torch.einsum("bhtk,bkd->bthd", probs.to(kv.dtype), torch.cat(keys, dim=1))
        return self.project_output(spec, o, angles)

    def compress(self, spec: LayerSpec, x: torch.Tensor, rope: Rope, st: StreamState) -> None:
        """Compressed KV and index keys of a KV source from its input x [B, T, H] (complete groups only)."""
        p, c, r = f"{spec.prefix}.attn", self.cfg, spec.compress_ratio
        n = x.shape[1] // r
        if r == 1:
            z = F.linear(x, self.p(f"{p}.compressor.wkv.weight"))
        else:
            with torch.autocast(x.device.type, enabled=False):  # the release pools in float32
                xs = x[:, : n * r].float()
                a = F.linear(xs, self.p(f"{p}.compressor.wkv.weight").float()).unflatten(1, (n, r))
                g = F.linear(xs, self.p(f"{p}.compressor.wgate.weight").float()).unflatten(1, (n, r))
                z = (a * g.softmax(dim=2)).sum(dim=2).to(x.dtype)
        latent = rms_norm(z, self.p(f"{p}.compressor.norm.weight"), c.rms_norm_eps)
        angles = rope.angles(torch.arange(n, device=x.device) * r)
        # the indexer learns only from its auxiliary loss: its inputs are cut from the LM graph
        ik = rms_norm(
            F.linear(latent.detach(), self.p(f"{p}.indexer.wk.weight")),
            self.p(f"{p}.indexer.k_norm.weight"),
            c.rms_norm_eps,
        )
        st.kv, st.index_keys, st.ratio = _rope(latent, angles), _rope(ik, angles), r

    def select(
        self,
        spec: LayerSpec,
        latent: torch.Tensor,
        x: torch.Tensor,
        angles: torch.Tensor,
        visible: torch.Tensor,
        comp_logits: torch.Tensor,
        st: StreamState,
    ) -> None:
        """Indexer scores, candidate blocks, top-k selection -> st.selected (+ the auxiliary loss)."""
        p, c = f"{spec.prefix}.attn.indexer", self.cfg
        b, t, _ = x.shape
        q = F.linear(latent.detach(), self.p(f"{p}.wq_b.weight"))
        q = _rope(q.unflatten(-1, (c.index_n_heads, c.index_head_dim)), angles)
        w = (
            F.linear(x.detach(), self.p(f"{p}.weights_proj.weight"))
            * (c.index_head_dim * c.index_n_heads) ** -0.5
        )
        dots = torch.einsum("bthd,bmd->bthm", q, st.index_keys.to(q.dtype))
        scores = (dots.relu() * w.unsqueeze(-1)).float().sum(dim=2)  # [B, T, M]
        if self.training:  # KL(dense attention over the visible entries || indexer distribution)
            target = comp_logits.detach().masked_fill(~visible, -1e4).softmax(-1).mean(1)  # [B, T, M]
            logp = scores.masked_fill(~visible, -1e4).log_softmax(-1)
            kl = (target * (target.clamp_min(1e-12).log() - logp)).sum(-1)
            st.aux.append(kl.masked_select(visible.any(-1).expand(b, t)).mean())
        scores = scores.masked_fill(~visible, -torch.inf)
        m = scores.shape[-1]
        if spec.is_candidate_source:
            vis = visible.sum(-1).expand(b, t).flatten()
            blocks = candidate_blocks(
                scores.flatten(0, 1), vis, c.candidate_topk_blocks, c.candidate_block_size
            )
            st.candidates = blocks.view(b, t, m)
        if spec.restricted_to_candidates:
            scores = scores.masked_fill(~st.candidates, -torch.inf)
        best = scores.detach().topk(min(c.index_topk, m), dim=-1)
        st.selected = torch.zeros_like(scores, dtype=torch.bool)
        st.selected.scatter_(-1, best.indices, torch.isfinite(best.values))


def _attr(name: str) -> str:
    return name.replace(".", "__")


def _rope(x: torch.Tensor, angles: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """RoPE of [B, T, ..., D] with angles [T, P] (the reference op rotates [N, ..., D] by [N, P])."""
    moved = x.transpose(0, 1)
    return rope_interleaved(moved, angles, inverse).transpose(0, 1)


def _window_mask(positions: torch.Tensor, window: int) -> torch.Tensor:
    """[T, T] bool: key s is in query t's window (t - W, t]."""
    d = positions.unsqueeze(-1) - positions
    return (d >= 0) & (d < window)
