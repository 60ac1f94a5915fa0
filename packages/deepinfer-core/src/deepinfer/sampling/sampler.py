"""The sampler: logits rows -> processed distributions -> one token per row, plus log-probabilities.

Pipeline per row: logit bias -> min_tokens ban (EOS, stop ids) -> presence/frequency/repetition
penalties -> greedy argmax, or temperature -> top-k -> top-p -> min-p -> inverse-CDF draw with the
counter-based uniform of (seed, position). Every operation is row-wise, so a row's result does not
depend on the other rows. Reported log-probabilities are those of the raw model distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from deepinfer.sampling import rng
from deepinfer.sampling.params import SamplingParams


@dataclass(slots=True)
class SampleRow:
    """One token to draw: which request settings, where, and the history penalties need."""

    params: SamplingParams
    seed: int  # int64 bit pattern of the uint64 seed
    position: int  # index of the token being generated (the RNG counter)
    num_outputs: int  # tokens generated before this one (min_tokens)
    prompt_ids: Sequence[int] = ()  # filled only when penalties are on
    output_ids: Sequence[int] = ()


@dataclass(slots=True)
class TokenLogprob:
    """Log-probability of a chosen token and the `k` most likely alternatives (raw distribution)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def to_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """int64 tensor of `values` on `device`, copied without waiting for the device's queued work."""
    t = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


class HostCopy:
    """Device tensors on their way to the host: the copies are queued now, `get()` waits for them alone.

    On CUDA the copies go to pinned memory behind an event, so neither queuing them nor waiting for
    them waits for work queued on the device after them (the next step's forward).
    """

    def __init__(self, *tensors: torch.Tensor):
        self._event = None
        if tensors and tensors[0].device.type == "cuda":
            self._tensors = [t.to("cpu", non_blocking=True) for t in tensors]
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._tensors = [t.to("cpu") for t in tensors]

    def get(self) -> list[torch.Tensor]:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._tensors


class PendingLogprobs:
    """`token_logprobs` computed on the device now; the `TokenLogprob` objects built on the host later."""

    def __init__(self, logits: torch.Tensor, token_ids: torch.Tensor, ks: list[int | None]):
        self.ks = ks
        self.wanted = [i for i, k in enumerate(ks) if k is not None]
        self._result: list[TokenLogprob | None] | None = None
        self._host = None
        if not self.wanted:
            return
        idx = to_device(self.wanted, logits.device)
        lp = torch.log_softmax(logits.index_select(0, idx).float(), dim=-1)
        tok = token_ids.to(logits.device).index_select(0, idx)
        chosen = lp.gather(1, tok[:, None])[:, 0]
        kmax = max(ks[i] for i in self.wanted)
        top_v, top_i = (lp.topk(kmax, dim=-1) if kmax else (lp[:, :0], lp[:, :0].long()))
        self._host = HostCopy(tok, chosen, top_v, top_i)

    def get(self) -> list[TokenLogprob | None]:
        if self._result is None:
            out: list[TokenLogprob | None] = [None] * len(self.ks)
            if self._host is not None:
                tok, chosen, top_v, top_i = (t.tolist() for t in self._host.get())
                for j, i in enumerate(self.wanted):
                    k = self.ks[i]
                    out[i] = TokenLogprob(tok[j], chosen[j], list(zip(top_i[j][:k], top_v[j][:k])))
            self._result = out
        return self._result


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, ks: list[int | None]) -> list[
        TokenLogprob | None]:
    """Raw log-probability of `token_ids[i]` under row i, with the top `ks[i]` (None: skip row)."""
    return PendingLogprobs(logits, token_ids, ks).get()


class SampleOutput:
    """Sampled tokens: `tokens` stays on the device (it feeds the next step's inputs without a host
    sync); `token_ids` and `logprobs` are their host copies, waited for only when first read."""

    def __init__(self, tokens: torch.Tensor, logprobs: PendingLogprobs):
        self.tokens = tokens
        self._host = HostCopy(tokens)
        self._logprobs = logprobs
        self._token_ids: list[int] | None = None

    @property
    def token_ids(self) -> list[int]:
        if self._token_ids is None:
            self._token_ids = self._host.get()[0].tolist()
        return self._token_ids

    @property
    def logprobs(self) -> list[TokenLogprob | None]:
        return self._logprobs.get()


class Sampler:
    def __init__(self, eos_token_id: int | None):
        self.eos_token_id = eos_token_id

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampleOutput:
        raw = logits.float()
        x = self._process(raw.clone(), rows)
        tokens = x.argmax(dim=-1)  # greedy rows keep this
        drawn = [i for i, r in enumerate(rows) if not r.params.greedy]
        if drawn:
            tokens[drawn] = self._draw(x[drawn], [rows[i] for i in drawn])
        logprobs = PendingLogprobs(raw, tokens, [r.params.logprobs for r in rows])
        return SampleOutput(tokens, logprobs)

    def _process(self, x: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        for i, r in enumerate(rows):
            p = r.params
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), device=x.device)
                x[i].index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), device=x.device))
            if r.num_outputs < p.min_tokens:
                banned = list(p.stop_token_ids)
                if not p.ignore_eos and self.eos_token_id is not None:
                    banned.append(self.eos_token_id)
                x[i, banned] = float("-inf")
            if p.has_penalties:
                self._penalize(x[i], r)
        return x

    @staticmethod
    def _penalize(row: torch.Tensor, r: SampleRow) -> None:
        p = r.params
        if r.output_ids and (p.presence_penalty or p.frequency_penalty):
            counts = torch.zeros_like(row)
            counts.index_add_(0, torch.tensor(r.output_ids, device=row.device), torch.ones(
                len(r.output_ids), device=row.device))
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted({*r.prompt_ids, *r.output_ids}), dtype=torch.long, device=row.device)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)

    @staticmethod
    def _draw(x: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        dev = x.device
        temps = torch.tensor([r.params.temperature for r in rows], device=dev)
        probs = torch.softmax(x / temps[:, None], dim=-1)
        filtered = [j for j, r in enumerate(rows)
                    if r.params.top_k > 0 or r.params.top_p < 1.0 or r.params.min_p > 0.0]
        if filtered:
            probs[filtered] = _filter(probs[filtered], [rows[j].params for j in filtered])
        cdf = probs.double().cumsum(dim=-1)
        seeds = torch.tensor([r.seed for r in rows], dtype=torch.int64, device=dev)
        positions = torch.tensor([r.position for r in rows], dtype=torch.int64, device=dev)
        u = rng.uniform(seeds, positions, rng.PURPOSE_SAMPLE) * cdf[:, -1]
        # first index whose cumulative mass exceeds u: always a token with non-zero probability
        return torch.searchsorted(cdf, u[:, None], right=True)[:, 0].clamp_(max=x.shape[-1] - 1)


def _filter(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Zero the tokens that top-k, top-p and min-p remove (decided on the sorted distribution)."""
    dev, vocab = probs.device, probs.shape[-1]
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    min_p = torch.tensor([p.min_p for p in params], device=dev)
    rank = torch.arange(vocab, device=dev)
    keep = rank[None, :] < top_k[:, None]
    keep &= (sorted_p.cumsum(dim=-1) - sorted_p) < top_p[:, None]  # mass before the token; keeps rank 0
    keep &= sorted_p >= min_p[:, None] * sorted_p[:, :1]
    mask = torch.zeros_like(keep).scatter_(1, order, keep)
    return probs * mask
