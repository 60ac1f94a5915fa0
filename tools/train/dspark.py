"""DSpark draft blocks (`mtp.*`) over a frozen target, full-batch and differentiable (model spec §10.2).

For anchors a (the golden token's position), the blocks run on [golden, noise, ...] at positions
a .. a+B-1, each slot attending to the keyed target features F_p of p in [a - W, a - 1], to all B
in-block keys and to the sink; slot j predicts the token at a + j + 1. Same function as the runtime's
`DSpark.draft` plus its Markov and confidence heads (checked against it on the same weights).

Training objective (`draft_losses`): cross-entropy of the Markov-corrected draft logits with teacher
Markov inputs (prev_0 = golden, prev_j = the true token at a + j), and a binary cross-entropy that
calibrates the confidence head on whether each slot's greedy draft equals its target; the confidence
head sees the raw collapsed state (the release convention) and its inputs are detached, so it learns
to predict acceptance without changing the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from deepinfer.ops.reference.mhc import hc_collapse
from deepinfer.ops.reference.norm import rms_norm
from tools.train.model import DeepseekV41Train


@dataclass
class Drafts:
    hidden: torch.Tensor  # [B, A, S, H] raw collapse of the last block
    base_logits: torch.Tensor  # [B, A, S, V] float32


def context_features(model: DeepseekV41Train, feats: torch.Tensor) -> torch.Tensor:
    """F = RMSNorm(main_proj T; main_norm): [B, T, n_targets * H] -> [B, T, H]."""
    first = model.cfg.layers[model.cfg.num_hidden_layers].prefix
    proj = F.linear(feats, model.p(f"{first}.main_proj.weight"))
    return rms_norm(proj, model.p(f"{first}.main_norm.weight"), model.cfg.rms_norm_eps)


def draft(model: DeepseekV41Train, ctx: torch.Tensor, golden: torch.Tensor, anchors: torch.Tensor) -> Drafts:
    """ctx [B, T, H] context features, golden [B, A] token ids at positions anchors [B, A]."""
    c = model.cfg
    b, a_n = anchors.shape
    s_n = c.dspark_block_size
    ids = torch.full((b, a_n, s_n), c.dspark_noise_token_id, dtype=torch.long, device=anchors.device)
    ids[..., 0] = golden
    pos = anchors.unsqueeze(-1) + torch.arange(s_n, device=anchors.device)  # [B, A, S]
    t = ctx.shape[1]
    ctx_pos = torch.arange(t, device=anchors.device)
    dist = anchors.unsqueeze(-1) - ctx_pos  # [B, A, T]
    ctx_mask = (dist >= 1) & (dist <= c.sliding_window)
    streams, pre = model.initial(ids)
    scale = c.head_dim**-0.5
    for spec in c.layers[c.num_hidden_layers :]:
        rope = model.ropes[spec.index]
        x, mix = model.attn_input(spec, streams, pre)
        x = x.view(b * a_n, s_n, -1)
        angles = rope.angles(pos.flatten())  # [B*A*S, P]
        q = _rope_rows(model, spec, x, angles, query=True)  # [B*A, S, h, D]
        k_blk = _rope_rows(model, spec, x, angles, query=False)  # [B*A, S, D]
        k_ctx = model.window_kv(spec, ctx, rope.angles(ctx_pos))  # [B, T, D]
        q = q.view(b, a_n, s_n, c.num_attention_heads, -1)
        lc = torch.einsum("bashd,btd->bahst", q, k_ctx).float() * scale
        lc = lc.masked_fill(~ctx_mask[:, :, None, None, :], -torch.inf)
        lb = torch.einsum("bashd,bacd->bahsc", q, k_blk.view(b, a_n, s_n, -1)).float() * scale
        sink = model.p(f"{spec.prefix}.attn.attn_sink").float().view(1, 1, -1, 1, 1).expand(*lb.shape[:4], 1)
        probs = torch.cat((lc, lb, sink), dim=-1).softmax(-1)[..., :-1].to(k_ctx.dtype)
        o = torch.einsum("bahst,btd->bashd", probs[..., :t], k_ctx) + torch.einsum(
            "bahsc,bacd->bashd", probs[..., t:], k_blk.view(b, a_n, s_n, -1)
        )
        o = o.reshape(b * a_n * s_n, 1, c.num_attention_heads, -1).transpose(0, 1)  # [1, N, h, D]
        y = model.project_output(spec, o, angles)[0]
        streams, pre = model.residual(y, streams, mix)
        streams, pre = model.ffn(spec, streams, pre)
    last = c.layers[-1].prefix
    hidden = hc_collapse(streams, pre)
    normed = rms_norm(hidden, model.p(f"{last}.norm.weight"), c.rms_norm_eps)
    return Drafts(hidden.view(b, a_n, s_n, -1), model.logits(normed).view(b, a_n, s_n, -1))


def _rope_rows(
    model: DeepseekV41Train, spec, x: torch.Tensor, angles: torch.Tensor, query: bool
) -> torch.Tensor:
    """Queries or window keys of x [n, S, H] rotated at per-row angles [n*S, P]."""
    flat = x.reshape(1, -1, x.shape[-1])
    out = model.query(spec, flat, angles)[1] if query else model.window_kv(spec, flat, angles)
    return out.view(x.shape[0], x.shape[1], *out.shape[2:])


def markov(model: DeepseekV41Train, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Markov logits [..., V] float32, embedding [..., r]) of the previous tokens."""
    last = model.cfg.layers[-1].prefix
    e = model.p(f"{last}.markov_head.embed.weight")[prev]
    return F.linear(e.float(), model.p(f"{last}.markov_head.head.weight").float()), e


def confidence(model: DeepseekV41Train, hidden: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Acceptance logits [...]: proj . [raw collapse ; Markov embedding]."""
    last = model.cfg.layers[-1].prefix
    feats = torch.cat((hidden.float(), e.float()), dim=-1)
    return F.linear(feats, model.p(f"{last}.confidence_head.proj.weight").float()).squeeze(-1)


def drafter_parameters(model: DeepseekV41Train) -> list[torch.nn.Parameter]:
    """Freeze the target (no gradients) and return the DSpark blocks' parameters (`mtp.*`)."""
    for name in model.names:
        model.p(name).requires_grad_(name.startswith("mtp."))
    return [model.p(name) for name in model.names if name.startswith("mtp.")]


def draft_losses(
    model: DeepseekV41Train, ids: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft cross-entropy, confidence BCE, per-slot greedy hit rate [S]) for anchors [B, A] with
    a + block_size < T (every slot has a target)."""
    s_n = model.cfg.dspark_block_size
    offs = torch.arange(s_n + 1, device=ids.device)
    window = ids.gather(1, (anchors.unsqueeze(-1) + offs).flatten(1)).view(*anchors.shape, s_n + 1)
    d = draft(model, context_features(model, feats), window[..., 0], anchors)
    mk, e = markov(model, window[..., :-1])  # teacher inputs: golden, then the true tokens
    logits = d.base_logits + mk
    targets = window[..., 1:]
    ce = F.cross_entropy(logits.flatten(0, 2), targets.flatten())
    hit = (logits.argmax(-1) == targets).float()
    conf = confidence(model, d.hidden.detach(), e.detach())
    bce = F.binary_cross_entropy_with_logits(conf, hit)
    return ce, bce, hit.mean(dim=(0, 1))
