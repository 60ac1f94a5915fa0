"""Exact verification of drafts: the emitted tokens follow the target model's distribution.

Each verification row decides one position: the target distribution q is the sampler's (logit bias,
min_tokens ban, penalties, then temperature and top-k/top-p/min-p; greedy rows are one-hot on the
argmax), the draft d came from distribution p (one-hot for deterministic drafts). The draft is
accepted with probability min(1, q(d) / p(d)); on rejection the token is drawn from the residual
normalise(max(0, q - p)). This is the standard speculative-sampling rule, so the emitted token has
law q; with a one-hot q (greedy) it keeps d iff d is the argmax and otherwise emits the argmax. A row
without a draft (the bonus row after all drafts were accepted, or a plain decode) samples exactly as
the sampler does. Draws use the counter RNG at the decided position with their own purposes, so a
result depends only on (seed, position, distributions), never on the batch.

On a greedy row q is one-hot on the argmax a, so the rule reduces to: accept iff d == a, else emit a
(p(d) > 0 for a drawn draft; the residual max(0, q - p) is a multiple of the one-hot q), whatever p
is. Greedy rows take that shortcut (one comparison instead of float64 distributions over the
vocabulary and two draws).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from deepinfer.ops import Ops, get_ops
from deepinfer.ops.reference.sampling import draw, filter_mask
from deepinfer.ops.sampling import SamplingMetadata
from deepinfer.sampling import rng
from deepinfer.sampling.params import SamplingParams
from deepinfer.sampling.sampler import PendingLogprobs, SampleRow, sampling_metadata, to_device

_GREEDY = SamplingParams(temperature=0)


def target_probs(adjusted: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """float64 [R, V] distributions the sampler draws from, given its adjusted logits: one-hot argmax on
    greedy rows, else softmax(logits / temperature) restricted by top-k / top-p / min-p, normalised."""
    probs = torch.softmax(adjusted / meta.temperature[:, None], dim=-1)
    if meta.any_filtered:
        probs = probs * filter_mask(probs, meta)
    probs = probs.double()
    probs = probs / probs.sum(dim=-1, keepdim=True)
    onehot = torch.zeros_like(probs).scatter_(1, adjusted.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(meta.greedy[:, None], onehot, probs)


def accept_drafts(
    q: torch.Tensor, p: torch.Tensor, drafts: torch.Tensor, u_accept: torch.Tensor, u_residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance test and residual resample, row-wise: (accepted [R] bool, token emitted when the
    draft is rejected [R] int64). q: target, p: draft distribution of each row (normalised, [R, V])."""
    q, p = q.double(), p.double()
    qd = q.gather(1, drafts[:, None])[:, 0]
    pd = p.gather(1, drafts[:, None])[:, 0]
    accepted = u_accept * pd < qd  # P = min(1, q(d) / p(d)); p(d) > 0 for a drawn draft
    residual = (q - p).clamp_min(0.0)
    # all-zero residual: q <= p everywhere, i.e. q == p, where rejection cannot happen; keep q drawable
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    return accepted, draw(torch.where(empty, q, residual), u_residual)


def row_metadata(rows: Sequence[SampleRow], vocab: int, eos_token_id: int | None, device: torch.device
                 ) -> tuple[SamplingMetadata, torch.Tensor]:
    """`sampling_metadata` of `rows`, cached when every row is plain greedy (no bias, penalties, ban or
    logprobs): the argmax of the raw logits, so the metadata depends on the row count alone (seeds and
    positions are read by draws only). Saves building and uploading ~25 small tensors per step."""
    if all(_plain_greedy(r) for r in rows):
        return _greedy_metadata(len(rows), vocab, eos_token_id, device)
    return sampling_metadata(rows, vocab, eos_token_id, device)


def _plain_greedy(row: SampleRow) -> bool:
    p = row.params
    return (p.greedy and not p.logit_bias and not p.has_penalties and p.logprobs is None
            and row.num_outputs >= p.min_tokens)


@functools.lru_cache(maxsize=64)
def _greedy_metadata(num_rows: int, vocab: int, eos_token_id: int | None, device: torch.device
                     ) -> tuple[SamplingMetadata, torch.Tensor]:
    return sampling_metadata([SampleRow(_GREEDY, 0, 0, 0)] * num_rows, vocab, eos_token_id, device)


def sample_drafts(
    logits: torch.Tensor, rows: Sequence[SampleRow], eos_token_id: int | None, ops: Ops | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft tokens from draft-model logits [n, V] with each row's request settings, drawn on the draft
    stream at the row's position: (tokens [n] int64, the float32 distributions they were drawn from)."""
    raw = logits.float()
    ops = ops or get_ops(device=raw.device)
    meta, _ = sampling_metadata(rows, raw.shape[-1], eos_token_id, raw.device)
    probs = target_probs(ops.apply_penalties(raw, meta), meta).float()
    return draw(probs, rng.uniform(meta.seeds, meta.positions, rng.PURPOSE_DRAFT)), probs


@dataclass
class VerifyOutput:
    """Per row: the token this row emits if it is reached (the accepted draft, the residual draw, or
    the fresh sample of a draft-less row), whether its draft was accepted, and the tokens' logprobs."""

    tokens: torch.Tensor  # [R] int64 on the logits' device
    accepted: torch.Tensor  # [R] bool, False on rows without a draft
    logprobs: PendingLogprobs


def verify(
    logits: torch.Tensor,
    rows: Sequence[SampleRow],
    drafts: Sequence[int],
    draft_probs: torch.Tensor | None,
    eos_token_id: int | None,
    ops: Ops | None = None,
) -> VerifyOutput:
    """Verify rows of raw logits [R, V]: row i decides position rows[i].position and carries draft
    `drafts[i]` (-1: none). `draft_probs` [D, V] holds the draft distributions of the rows with a
    draft, in order (None: every draft is deterministic)."""
    raw = logits.float()
    ops = ops or get_ops(device=raw.device)
    meta, logprob_rows = row_metadata(rows, raw.shape[-1], eos_token_id, raw.device)
    adjusted = ops.apply_penalties(raw, meta)
    tokens = ops.sample_tokens(adjusted, meta)  # what a draft-less row emits: exactly the sampler's
    accepted = torch.zeros_like(tokens, dtype=torch.bool)
    drafted = [i for i, d in enumerate(drafts) if d >= 0]
    greedy = [i for i in drafted if rows[i].params.greedy]
    if greedy:  # tokens already holds the argmax
        idx = to_device(greedy, raw.device)
        d = to_device([drafts[i] for i in greedy], raw.device)
        accepted[idx] = tokens.index_select(0, idx) == d
    drawn = [j for j, i in enumerate(drafted) if not rows[i].params.greedy]  # among the drafted rows
    if drawn:
        with_draft = [drafted[j] for j in drawn]
        idx = to_device(with_draft, raw.device)
        d = to_device([drafts[i] for i in with_draft], raw.device)
        sub = _select(meta, idx)
        q = target_probs(adjusted.index_select(0, idx), sub)
        if draft_probs is not None and len(drawn) < len(drafted):
            draft_probs = draft_probs.index_select(0, to_device(drawn, draft_probs.device))
        p = draft_probs if draft_probs is not None else torch.zeros_like(q).scatter_(1, d[:, None], 1.0)
        u_accept = rng.uniform(sub.seeds, sub.positions, rng.PURPOSE_ACCEPT)
        u_residual = rng.uniform(sub.seeds, sub.positions, rng.PURPOSE_RESIDUAL)
        ok, corrected = accept_drafts(q, p, d, u_accept, u_residual)
        accepted[idx] = ok
        tokens[idx] = torch.where(ok, d, corrected)
    ks = [r.params.logprobs for r in rows]
    return VerifyOutput(tokens, accepted, PendingLogprobs(raw, tokens, ks, logprob_rows, ops))


def _select(meta: SamplingMetadata, idx: torch.Tensor) -> SamplingMetadata:
    """`meta` restricted to rows `idx` (the per-row fields target_probs and the draws read)."""
    return replace(meta, **{f: getattr(meta, f).index_select(0, idx) for f in _ROW_FIELDS})


_ROW_FIELDS = ("greedy", "temperature", "top_k", "top_p", "min_p", "filtered", "seeds", "positions")
