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
    once per request) and are laid out by numpy straight into the copy's buffer; only rows with a bias,
    a min_tokens ban, penalties or logprobs go through the per-row part, and a step without any shares
    one set of empty device tensors for the (row, token) pair fields."""
    n = len(rows)
    dense, special = [], []
    for i, r in enumerate(rows):
        row, extra = r.params.sampler_row
        dense.append(row)
        if extra:
            special.append(i)
    table = np.array(dense, dtype=np.float64).reshape(n, len(_DENSE))
    sparse = _sparse_fields(rows, special, table, eos_token_id) if special else None
    top_k = table[:, _DENSE.index("top_k")]
    # grouped by dtype, one [fields, rows] array each: the device side is three views and unbinds
    ints = np.stack([np.where(top_k > 0, top_k, vocab).astype(np.int64),
                     np.array([r.seed for r in rows], dtype=np.int64),
                     np.array([r.position for r in rows], dtype=np.int64)])
    floats = np.ascontiguousarray(table[:, : len(_FLOAT_FIELDS)].T, dtype=np.float32)
    flags = np.ascontiguousarray(table[:, _DENSE.index("greedy") :].T != 0)  # greedy, filtered
    parts = copy_to_device([ints, floats, flags, *(sparse.values() if sparse else ())], device)
    fields = dict(zip(("top_k", "seeds", "positions"), parts[0].unbind(0), strict=True))
    fields.update(zip(_FLOAT_FIELDS, parts[1].unbind(0), strict=True))
    fields["greedy"], fields["filtered"] = parts[2].unbind(0)
    fields.update(zip(sparse, parts[3:], strict=True) if sparse else _no_pairs(device).items())
    logprob_rows = fields.pop("logprob_rows")
    meta = SamplingMetadata(
        **fields,
        any_drawn=not bool(flags[0].all()),
        any_filtered=bool(flags[1].any()),
        any_adjusted=sparse is not None and any(sparse[k].size for k in _ADJUSTING),
    )
    return meta, logprob_rows


def _sparse_fields(rows: Sequence[SampleRow], special: list[int], table: np.ndarray,
                   eos_token_id: int | None) -> dict[str, np.ndarray]:
    """The (row, token) pair fields and logprob rows of the `special` rows; zeroes the presence and
    frequency of those rows with nothing generated yet (in `table`)."""
    ints: dict[str, list[int]] = {k: [] for k in _SPARSE_INT_FIELDS}
    bias_values: list[float] = []
    presence, frequency = _DENSE.index("presence"), _DENSE.index("frequency")
    for i in special:
        r = rows[i]
        p = r.params
        for token, value in p.logit_bias.items():
            ints["bias_rows"].append(i)
            ints["bias_ids"].append(token)
            bias_values.append(value)
        if r.num_outputs < p.min_tokens:
            banned = [*p.stop_token_ids]
            if not p.ignore_eos and eos_token_id is not None:
                banned.append(eos_token_id)
            ints["ban_rows"] += [i] * len(banned)
            ints["ban_ids"] += banned
        if not r.output_ids:  # nothing generated yet to count
            table[i, presence] = table[i, frequency] = 0.0
        elif table[i, presence] or table[i, frequency]:
            ints["output_rows"] += [i] * len(r.output_ids)
            ints["output_ids"] += r.output_ids
        if table[i, _DENSE.index("repetition")] != 1.0:
            seen = {*r.prompt_ids, *r.output_ids}
            ints["seen_rows"] += [i] * len(seen)
            ints["seen_ids"] += seen
        if p.logprobs is not None:
            ints["logprob_rows"].append(i)
    return {**{k: np.array(v, dtype=np.int64) for k, v in ints.items()},
            "bias_values": np.array(bias_values, dtype=np.float32)}


_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")
# per-row columns of SamplingParams.sampler_row (float64 holds each exactly: top_k is below 2**53)
_DENSE = (*_FLOAT_FIELDS, "top_k", "greedy", "filtered")
_SPARSE_INT_FIELDS = ("bias_rows", "bias_ids", "ban_rows", "ban_ids", "output_rows", "output_ids",
                      "seen_rows", "seen_ids", "logprob_rows")
_ADJUSTING = ("bias_rows", "ban_rows", "output_rows", "seen_rows")  # pairs that change logits
_EMPTY: dict[torch.device, dict[str, torch.Tensor]] = {}


def _no_pairs(device: torch.device) -> dict[str, torch.Tensor]:
    """The pair fields and logprob rows of a step without per-row parts: empty device tensors, made
    once per device (never written)."""
    if device not in _EMPTY:
        ints = torch.empty(0, dtype=torch.int64, device=device)
        _EMPTY[device] = {**{k: ints for k in _SPARSE_INT_FIELDS},
                          "bias_values": torch.empty(0, dtype=torch.float32, device=device)}
    return _EMPTY[device]


def copy_to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Contiguous numpy arrays -> tensors of the same dtypes and shapes on `device`, moved as one byte
    buffer (pinned and non-blocking on CUDA, so it does not wait for queued device work); each part
    starts 8-byte aligned."""
    spans, offset = [], 0
    for a in arrays:
        spans.append((offset, a.nbytes))
        offset += a.nbytes + -a.nbytes % 8
    # written in place through numpy: no per-part tensors, and on CUDA no second copy into pinned memory
    buf = torch.empty(offset, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host = buf.numpy()
    for a, (o, n) in zip(arrays, spans, strict=True):
        if n:
            host[o : o + n] = a.reshape(-1).view(np.uint8)
    buf = buf.to(device, non_blocking=True)
    return [buf[o : o + n].view(_TORCH_DTYPES[a.dtype]).view(a.shape)
            for a, (o, n) in zip(arrays, spans, strict=True)]


_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.float32): torch.float32,
                 np.dtype(np.bool_): torch.bool}
