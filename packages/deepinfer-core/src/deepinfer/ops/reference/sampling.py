"""Sampling over a batch of logits rows with per-row settings (ops.sampling.SamplingMetadata).

Every stage is row-wise, so a row's result does not depend on the other rows; nothing here reads
device values on the host.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer.ops.sampling import SamplingMetadata
from deepinfer.sampling import rng


def apply_penalties(logits: torch.Tensor, s: SamplingMetadata) -> torch.Tensor:
    """Float32 logits [B, V] -> adjusted copy: logit bias, then the min_tokens ban (-inf), then
    presence/frequency penalties over generated tokens, then the repetition penalty over prompt and
    generated tokens (positive logits divided, negative ones multiplied). Returns `logits` itself
    when nothing applies."""
    if not s.any_adjusted:
        return logits
    x = logits.clone()
    x.index_put_((s.bias_rows, s.bias_ids), s.bias_values, accumulate=True)
    x.index_put_((s.ban_rows, s.ban_ids), x.new_full((), float("-inf")))
    counts = torch.zeros_like(x).index_put_(
        (s.output_rows, s.output_ids), x.new_ones(()).expand(s.output_ids.shape), accumulate=True
    )
    x -= s.frequency[:, None] * counts + s.presence[:, None] * (counts > 0).float()
    seen = torch.zeros_like(x, dtype=torch.bool).index_put_(
        (s.seen_rows, s.seen_ids), torch.ones((), dtype=torch.bool, device=x.device)
    )
    rep = s.repetition[:, None]
    return torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)


def sample_tokens(logits: torch.Tensor, s: SamplingMetadata) -> torch.Tensor:
    """Adjusted float32 logits [B, V] -> token ids [B] int64: argmax on greedy rows; elsewhere
    softmax(logits / temperature), top-k / top-p / min-p filtering, then an inverse-CDF draw with
    the counter-based uniform of (seed, position)."""
    tokens = logits.argmax(dim=-1)
    if not s.any_drawn:
        return tokens
    probs = torch.softmax(logits / s.temperature[:, None], dim=-1)
    if s.any_filtered:
        probs = probs * filter_mask(probs, s)
    drawn = draw(probs, rng.uniform(s.seeds, s.positions, rng.PURPOSE_SAMPLE))
    return torch.where(s.greedy, tokens, drawn)


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one token per row of (unnormalised, non-negative) `probs` with uniforms `u`:
    the first index whose cumulative mass exceeds u * total, so never a zero-probability token."""
    cdf = probs.double().cumsum(dim=-1)
    x = (u * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, x, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)


def filter_mask(probs: torch.Tensor, s: SamplingMetadata) -> torch.Tensor:
    """[B, V] bool: tokens that top-k, top-p and min-p keep (decided on the sorted distribution);
    all of them on rows without a filter."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)
    keep = rank[None, :] < s.top_k[:, None]
    keep &= (sorted_p.cumsum(dim=-1) - sorted_p) < s.top_p[:, None]  # mass before the token; keeps rank 0
    keep &= sorted_p >= s.min_p[:, None] * sorted_p[:, :1]
    keep |= ~s.filtered[:, None]
    return torch.zeros_like(keep).scatter_(1, order, keep)


def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, rows: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw log-probabilities of rows `rows` [R] of logits [B, V]: (of token_ids[row] [R] float32,
    top-k values [R, k] float32, top-k ids [R, k] int64)."""
    lp = torch.log_softmax(logits.index_select(0, rows).float(), dim=-1)
    chosen = lp.gather(1, token_ids.index_select(0, rows)[:, None])[:, 0]
    if k == 0:
        return chosen, lp[:, :0], lp[:, :0].long()
    top_v, top_i = lp.topk(k, dim=-1)
    return chosen, top_v, top_i


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] with -inf at every token a structured-output bitmask [B, ceil(V / 32)] int32
    forbids (bit t % 32 of word t // 32 clear); rows whose words are all -1 are unchanged."""
    # Little-endian: byte j of word w holds tokens 32w + 8j .. 32w + 8j + 7, so each byte indexes a row
    # of 8 additive biases (0 or -inf); a table lookup plus one add is ~2.5x cheaper than unpacking
    # bits into an int32 intermediate and masked_fill on CPU.
    table = _BYTE_BIASES.to(device=logits.device, dtype=logits.dtype)
    bias = F.embedding(bitmask.contiguous().view(torch.uint8).long(), table).flatten(1)
    return logits + bias[:, : logits.shape[-1]]


_BYTE_BIASES = torch.tensor([[0.0 if (v >> b) & 1 else float("-inf") for b in range(8)] for v in range(256)])
