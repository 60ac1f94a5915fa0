"""Held-out loss of the target and DSpark acceptance (greedy) with its confidence calibration."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tools.train import dspark
from tools.train.model import DeepseekV41Train

CONF_BUCKETS = 10


@torch.no_grad()
def held_out_loss(model: DeepseekV41Train, windows: torch.Tensor, bf16: bool, batch: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over held-out windows [n, T+1], bf16 autocast or float32."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch]
        with torch.autocast(w.device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden, _, _ = model(w[:, :-1])
        logits = model.logits(hidden)
        total += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    model.train(was)
    return total / count


@torch.no_grad()
def greedy_continue(model: DeepseekV41Train, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation by full recompute (float32): [n, P] -> [n, P + new_tokens]."""
    seq = prompts
    for _ in range(new_tokens):
        hidden, _, _ = model(seq)
        seq = torch.cat((seq, model.logits(hidden[:, -1]).argmax(-1, keepdim=True)), dim=1)
    return seq


@torch.no_grad()
def acceptance(model: DeepseekV41Train, prompts: torch.Tensor, new_tokens: int) -> dict:
    """Greedy drafting against the target's own greedy continuation of held-out prompts.

    Every position a of the continuation (with a full block after it) is an anchor: the drafter gets
    the golden token seq[a], drafts sequentially with the Markov correction fed its own previous draft
    (the inference convention), and a draft is accepted while it equals the target's greedy token.
    Reports the mean number of accepted drafts per verify step for draft length k = 1..B, and the
    per-slot acceptance (given the slots before it were accepted) per confidence bucket.
    """
    model.eval()
    c = model.cfg
    s_n = c.dspark_block_size
    seq = greedy_continue(model, prompts, new_tokens)
    n, p = prompts.shape
    _, feats, _ = model(seq)
    anchors = torch.arange(p, seq.shape[1] - s_n, device=seq.device).expand(n, -1)
    d = dspark.draft(model, dspark.context_features(model, feats), seq.gather(1, anchors), anchors)
    prev = seq.gather(1, anchors)
    drafts, confs = [], []
    for j in range(s_n):
        mk, e = dspark.markov(model, prev)
        confs.append(torch.sigmoid(dspark.confidence(model, d.hidden[:, :, j], e)))
        prev = (d.base_logits[:, :, j] + mk).argmax(-1)
        drafts.append(prev)
    truth = seq.gather(1, (anchors.unsqueeze(-1) + torch.arange(1, s_n + 1, device=seq.device)).flatten(1))
    match = torch.stack(drafts, -1) == truth.view(n, -1, s_n)  # [n, A, S]
    run = match.long().cumprod(-1)
    result = {
        "anchors": int(run.shape[0] * run.shape[1]),
        "mean_accepted": {k: run[..., :k].sum(-1).float().mean().item() for k in range(1, s_n + 1)},
    }
    conf = torch.stack(confs, -1)
    reached = torch.cat((torch.ones_like(run[..., :1]), run[..., :-1]), -1).bool()  # previous slots accepted
    table = []
    for b in range(CONF_BUCKETS):
        lo, hi = b / CONF_BUCKETS, (b + 1) / CONF_BUCKETS
        sel = reached & (conf >= lo) & ((conf < hi) if b < CONF_BUCKETS - 1 else (conf <= hi))
        count = int(sel.sum())
        rate = match[sel].float().mean().item() if count else math.nan
        table.append(
            {
                "bucket": f"{lo:.1f}-{hi:.1f}",
                "count": count,
                "accept_rate": rate,
                "mean_confidence": conf[sel].mean().item() if count else math.nan,
            }
        )
    result["calibration"] = table
    result["per_slot_accept"] = [match[..., j][reached[..., j]].float().mean().item() for j in range(s_n)]
    return result
