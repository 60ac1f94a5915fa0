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

import numpy as np
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
    the host and moved in one copy. Each row's columns come from its params (`sampler_row`, computed
    once per request) and are laid out by numpy; only rows with a bias, a min_tokens ban, penalties or
    logprobs go through the per-row part."""
    ints: dict[str, list[int]] = {k: [] for k in _SPARSE_INT_FIELDS}
    floats: dict[str, list[float]] = {"bias_values": []}
    dense, special = [], []
    for i, r in enumerate(rows):
        row, extra = r.params.sampler_row
        dense.append(row)
        if extra:
            special.append(i)
    table = np.array(dense, dtype=np.float64).reshape(len(rows), len(_DENSE))
    for i in special:
        r = rows[i]
        p = r.params
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
        if not r.output_ids:  # nothing generated yet to count
            table[i, _DENSE.index("presence")] = table[i, _DENSE.index("frequency")] = 0.0
        elif table[i, _DENSE.index("presence")] or table[i, _DENSE.index("frequency")]:
            ints["output_rows"] += [i] * len(r.output_ids)
            ints["output_ids"] += r.output_ids
        if table[i, _DENSE.index("repetition")] != 1.0:
            seen = {*r.prompt_ids, *r.output_ids}
            ints["seen_rows"] += [i] * len(seen)
            ints["seen_ids"] += seen
        if p.logprobs is not None:
            ints["logprob_rows"].append(i)
    col = {k: table[:, j] for j, k in enumerate(_DENSE)}
    host = {
        "top_k": torch.tensor(np.where(col["top_k"] > 0, col["top_k"], vocab), dtype=torch.int64),
        "seeds": torch.tensor([r.seed for r in rows], dtype=torch.int64),
        "positions": torch.tensor([r.position for r in rows], dtype=torch.int64),
        **{k: torch.tensor(v, dtype=torch.int64) for k, v in ints.items()},
        **{k: torch.tensor(col[k], dtype=torch.float32) for k in _FLOAT_FIELDS},
        "bias_values": torch.tensor(floats["bias_values"], dtype=torch.float32),
        "greedy": torch.tensor(col["greedy"] != 0),
        "filtered": torch.tensor(col["filtered"] != 0),
    }
    fields = dict(zip(host, copy_to_device(list(host.values()), device), strict=True))
    logprob_rows = fields.pop("logprob_rows")
    meta = SamplingMetadata(
        **fields,
        any_drawn=not bool(col["greedy"].all()),
        any_filtered=bool(col["filtered"].any()),
        any_adjusted=bool(ints["bias_rows"] or ints["ban_rows"] or ints["output_rows"] or ints["seen_rows"]),
    )
    return meta, logprob_rows


_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")
# per-row columns of SamplingParams.sampler_row (float64 holds each exactly: top_k is below 2**53)
_DENSE = (*_FLOAT_FIELDS, "top_k", "greedy", "filtered")
_SPARSE_INT_FIELDS = ("bias_rows", "bias_ids", "ban_rows", "ban_ids", "output_rows", "output_ids",
                      "seen_rows", "seen_ids", "logprob_rows")


def copy_to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """1-D host tensors -> the same on `device`, moved as one byte buffer (pinned and non-blocking on
    CUDA, so it does not wait for queued device work); each part starts 8-byte aligned."""
    spans, offset = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        spans.append((offset, n))
        offset += n + -n % 8
    # written in place through numpy: no per-part tensors, and on CUDA no second copy into pinned memory
    buf = torch.zeros(offset, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host = buf.numpy()
    for t, (o, n) in zip(tensors, spans, strict=True):
        if n:
            host[o : o + n] = np.ascontiguousarray(t.numpy()).view(np.uint8)
    buf = buf.to(device, non_blocking=True)
    return [buf[o : o + n].view(t.dtype) for t, (o, n) in zip(tensors, spans, strict=True)]
