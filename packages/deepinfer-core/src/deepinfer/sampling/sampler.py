"""The sampler: logits rows -> processed distributions -> one token per row, plus log-probabilities.

Pipeline per row: logit bias -> min_tokens ban (EOS, stop ids) -> presence/frequency/repetition
penalties -> greedy argmax, or temperature -> top-k -> top-p -> min-p -> inverse-CDF draw with the
counter-based uniform of (seed, position). Every operation is row-wise, so a row's result does not
depend on the other rows. Reported log-probabilities are those of the raw model distribution.

The rows become one `SamplingMetadata` per step (host lists, one copy to the device); the pipeline runs
as the ops `apply_penalties`, `sample_tokens` and `compute_logprobs` over the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from deepinfer.ops import Ops, get_ops
from deepinfer.ops.sampling import SamplingMetadata
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

    def __init__(
        self,
        logits: torch.Tensor,
        token_ids: torch.Tensor,
        ks: list[int | None],
        rows: torch.Tensor | None = None,
        ops: Ops | None = None,
    ):
        """`rows`: the device indices of the rows whose k is not None, when already there."""
        self.ks = ks
        self.wanted = [i for i, k in enumerate(ks) if k is not None]
        self._result: list[TokenLogprob | None] | None = None
        self._host = None
        if not self.wanted:
            return
        ops = ops or get_ops(device=logits.device)
        rows = to_device(self.wanted, logits.device) if rows is None else rows
        kmax = max(ks[i] for i in self.wanted)
        token_ids = token_ids.to(logits.device)
        chosen, top_v, top_i = ops.compute_logprobs(logits, token_ids, rows, kmax)
        self._host = HostCopy(token_ids.index_select(0, rows), chosen, top_v, top_i)

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
    """Logits rows -> `SampleOutput`, through the sampling ops of `ops` (default: the best installed
    backend of the logits' device)."""

    def __init__(self, eos_token_id: int | None, ops: Ops | None = None):
        self.eos_token_id = eos_token_id
        self.ops = ops

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampleOutput:
        raw = logits.float()
        ops = self.ops or get_ops(device=raw.device)
        meta, logprob_rows = sampling_metadata(rows, raw.shape[-1], self.eos_token_id, raw.device)
        tokens = ops.sample_tokens(ops.apply_penalties(raw, meta), meta)
        logprobs = PendingLogprobs(raw, tokens, [r.params.logprobs for r in rows], logprob_rows, ops)
        return SampleOutput(tokens, logprobs)


def sampling_metadata(
    rows: Sequence[SampleRow], vocab: int, eos_token_id: int | None, device: torch.device
) -> tuple[SamplingMetadata, torch.Tensor]:
    """The step's `SamplingMetadata` and the device indices of the rows that want logprobs, built on
    the host and moved in one copy."""
    ints: dict[str, list[int]] = {k: [] for k in _INT_FIELDS}
    floats: dict[str, list[float]] = {k: [] for k in _FLOAT_FIELDS}
    flags: dict[str, list[bool]] = {"greedy": [], "filtered": []}
    for i, r in enumerate(rows):
        p = r.params
        drawn = not p.greedy
        flags["greedy"].append(not drawn)
        flags["filtered"].append(drawn and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0))
        floats["temperature"].append(p.temperature if drawn else 1.0)
        ints["top_k"].append(p.top_k if p.top_k > 0 else vocab)
        floats["top_p"].append(p.top_p)
        floats["min_p"].append(p.min_p)
        ints["seeds"].append(r.seed)
        ints["positions"].append(r.position)
        for token, value in p.logit_bias.items():
            ints["bias_rows"].append(i)
            ints["bias_ids"].append(token)
            floats["bias_values"].append(value)
        if r.num_outputs < p.min_tokens:
            banned = [*p.stop_token_ids]
            if not p.ignore_eos and eos_token_id is not None:
                banned.append(eos_token_id)
            ints["ban_rows"] += [i] * len(banned)
            ints["ban_ids"] += banned
        counted = p.has_penalties and bool(r.output_ids) and bool(p.presence_penalty or p.frequency_penalty)
        floats["presence"].append(p.presence_penalty if counted else 0.0)
        floats["frequency"].append(p.frequency_penalty if counted else 0.0)
        if counted:
            ints["output_rows"] += [i] * len(r.output_ids)
            ints["output_ids"] += r.output_ids
        repeated = p.has_penalties and p.repetition_penalty != 1.0
        floats["repetition"].append(p.repetition_penalty if repeated else 1.0)
        if repeated:
            seen = {*r.prompt_ids, *r.output_ids}
            ints["seen_rows"] += [i] * len(seen)
            ints["seen_ids"] += seen
        if p.logprobs is not None:
            ints["logprob_rows"].append(i)
    host = [torch.tensor(v, dtype=torch.int64) for v in ints.values()]
    host += [torch.tensor(v, dtype=torch.float32) for v in floats.values()]
    host += [torch.tensor(v, dtype=torch.bool) for v in flags.values()]
    names = [*ints, *floats, *flags]
    fields = dict(zip(names, copy_to_device(host, device), strict=True))
    logprob_rows = fields.pop("logprob_rows")
    meta = SamplingMetadata(
        **fields,
        any_drawn=not all(flags["greedy"]),
        any_filtered=any(flags["filtered"]),
        any_adjusted=bool(ints["bias_rows"] or ints["ban_rows"] or ints["output_rows"] or ints["seen_rows"]),
    )
    return meta, logprob_rows


_INT_FIELDS = ("top_k", "seeds", "positions", "bias_rows", "bias_ids", "ban_rows", "ban_ids", "output_rows",
               "output_ids", "seen_rows", "seen_ids", "logprob_rows")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition", "bias_values")


def copy_to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """1-D host tensors -> the same on `device`, moved as one byte buffer (pinned and non-blocking on
    CUDA, so it does not wait for queued device work); each part starts 8-byte aligned."""
    parts, spans, offset = [], [], 0
    for t in tensors:
        raw = t.view(torch.uint8)
        pad = -raw.numel() % 8
        parts += [raw, torch.zeros(pad, dtype=torch.uint8)]
        spans.append((offset, raw.numel()))
        offset += raw.numel() + pad
    buf = torch.cat(parts)
    if device.type == "cuda":
        buf = buf.pin_memory()
    buf = buf.to(device, non_blocking=True)
    return [buf[o : o + n].view(t.dtype) for t, (o, n) in zip(tensors, spans, strict=True)]
