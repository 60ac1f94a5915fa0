"""The sampler: logits rows -> processed distributions -> one token per row, plus log-probabilities.

Pipeline per row: logit bias -> min_tokens ban (EOS, stop ids) -> presence/frequency/repetition
penalties -> greedy argmax, or temperature -> top-k -> top-p -> min-p -> inverse-CDF draw with the
counter-based uniform of (seed, position). Every operation is row-wise, so a row's result does not
depend on the other rows. Reported log-probabilities are those of the raw model distribution.

The rows become one `SamplingMetadata` per step (host arrays, one copy to the device); the pipeline
runs as the ops `apply_penalties`, `sample_tokens` and `compute_logprobs` over the whole batch. Where
the model records CUDA graphs, small steps of rows without penalties or logprobs replay a recorded
`sample_tokens` instead (`SamplingGraphs`: the same kernels, so the same tokens, launched at once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from deepinfer.ops import Ops, get_ops
from deepinfer.ops.recorder import Recorder
from deepinfer.ops.sampling import SamplingMetadata
from deepinfer.sampling.params import SamplingParams

logger = logging.getLogger(__name__)


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
    backend of the logits' device). With a graph `recorder` (the model's: set by the model runner),
    steps of up to GRAPH_ROWS plain rows replay recorded graphs of `sample_tokens` (`SamplingGraphs`),
    recorded ahead by `record_graphs` (the engine's start-up), else at first use."""

    def __init__(self, eos_token_id: int | None, ops: Ops | None = None):
        self.eos_token_id = eos_token_id
        self.ops = ops
        self.recorder: Recorder | None = None
        self._graphs: SamplingGraphs | None = None

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampleOutput:
        raw = logits.float()
        ops = self.ops or get_ops(device=raw.device)
        table, special = _dense_table(rows)
        if self.recorder is not None and not special and len(rows) <= GRAPH_ROWS and raw.is_contiguous():
            if self._graphs is None or self._graphs.ops is not ops:
                self._graphs = SamplingGraphs(ops, raw.shape[-1], raw.device, self.recorder)
            tokens = self._graphs.sample(raw, rows, table)
            if tokens is not None:
                return SampleOutput(tokens, PendingLogprobs(raw, tokens, [None] * len(rows)))
        meta, logprob_rows = _metadata(rows, table, special, raw.shape[-1], self.eos_token_id, raw.device)
        tokens = ops.sample_tokens(ops.apply_penalties(raw, meta), meta)
        logprobs = PendingLogprobs(raw, tokens, [r.params.logprobs for r in rows], logprob_rows, ops)
        return SampleOutput(tokens, logprobs)

    def record_graphs(self, vocab: int, device: torch.device, max_rows: int) -> None:
        """Record every graph a step of up to `max_rows` plain rows of `vocab` logits on `device` can
        replay, so that no step stops to record one (warm-up, synchronisation, capture); nothing without
        a recorder."""
        if self.recorder is not None:
            self._graphs = SamplingGraphs(self.ops or get_ops(device=device), vocab, device, self.recorder)
            self._graphs.record_ahead(max_rows)


GRAPH_ROWS = 16  # most rows a sampling graph takes (its static logits: 16 x vocab float32)
_GRAPH_BUCKETS = (1, 2, 4, 8, 16)
# the (any drawn row, any filtered row) kinds of a step: only drawn rows are filtered (sampler_row)
_GRAPH_KINDS = ((False, False), (True, False), (True, True))
# a padding row of a graph's bucket: greedy over the earlier (finite) logits left in its static row
_PAD_ROW = np.array(SamplingParams(temperature=0.0).sampler_row[0], dtype=np.float64)


@dataclass
class _SamplingGraph:
    upload: torch.Tensor  # the device bytes its metadata views read
    tokens: torch.Tensor  # its output: [bucket] int64
    replay: Callable[[], None]


class SamplingGraphs:
    """Recorded `sample_tokens` for steps of plain rows (no bias, min_tokens ban, penalties or
    logprobs: `apply_penalties` and `compute_logprobs` have nothing to do): one graph per (row bucket,
    any drawn row, any filtered row), recorded ahead (`record_ahead`, at the engine's start-up) or at
    first use. A step copies its logits rows into the static logits and its dense metadata (padded to
    the bucket with greedy rows) into the graph's static metadata in one upload, replays, and clones
    the tokens out: the same kernels on the same values as the eager path, so the same tokens, with
    one launch instead of the op's several. A recording that fails leaves every later step eager
    (logged once)."""

    def __init__(self, ops: Ops, vocab: int, device: torch.device, recorder: Recorder) -> None:
        self.ops, self.vocab, self.device, self.recorder = ops, vocab, device, recorder
        self.logits = torch.zeros(GRAPH_ROWS, vocab, dtype=torch.float32, device=device)
        self.graphs: dict[tuple[int, bool, bool], _SamplingGraph] = {}
        self.failed = False

    def sample(self, logits: torch.Tensor, rows: Sequence[SampleRow], table: np.ndarray
               ) -> torch.Tensor | None:
        """Tokens of `rows` (plain, `table` their dense columns); None when the graphs are off."""
        n = len(rows)
        bucket = next(b for b in _GRAPH_BUCKETS if b >= n)
        padded = np.concatenate([table, np.broadcast_to(_PAD_ROW, (bucket - n, len(_DENSE)))])
        seeds = [r.seed for r in rows] + [0] * (bucket - n)
        positions = [r.position for r in rows] + [0] * (bucket - n)
        arrays = _dense_arrays(padded, seeds, positions, self.vocab)
        key = (bucket, *_kind(arrays[2]))
        graph = self.graphs.get(key) or self._record(key)
        if graph is None:
            return None
        host, _ = _pack(arrays, pin=self.device.type == "cuda")
        graph.upload.copy_(host, non_blocking=True)
        self.logits[:n].copy_(logits)
        graph.replay()
        return graph.tokens[:n].clone()

    def record_ahead(self, max_rows: int) -> int:
        """Record the graph of every key a step of up to `max_rows` rows can take (each bucket up to the
        one holding min(max_rows, GRAPH_ROWS), of each kind), largest first as the forward graphs are;
        the number recorded, logged with the time and the device memory they hold."""
        top = next(b for b in _GRAPH_BUCKETS if b >= min(max_rows, GRAPH_ROWS))
        keys = [(b, *kind) for b in reversed(_GRAPH_BUCKETS) if b <= top for kind in _GRAPH_KINDS]
        cuda = self.device.type == "cuda"
        reserved = torch.cuda.memory_reserved(self.device) if cuda else 0
        t0 = time.perf_counter()
        count = sum(self._record(key) is not None for key in keys if key not in self.graphs)
        # the static logits and what the caching allocator reserved meanwhile (the recorder's pool
        # segments, blocks the warm-ups left cached)
        held = self.logits.nbytes + (torch.cuda.memory_reserved(self.device) - reserved if cuda else 0)
        logger.info("sampling graphs: recorded %d graphs of up to %d rows in %.2f s (+%.1f MiB device)",
                    count, top, time.perf_counter() - t0, held / 2**20)
        return count

    def _record(self, key: tuple[int, bool, bool]) -> _SamplingGraph | None:
        if self.failed:
            return None
        bucket, drawn, filtered = key
        # the bucket's metadata layout; its values are a step's own, uploaded before each replay
        pad = np.broadcast_to(_PAD_ROW, (bucket, len(_DENSE)))
        arrays = _dense_arrays(pad, [0] * bucket, [0] * bucket, self.vocab)
        host, spans = _pack(arrays, pin=self.device.type == "cuda")
        upload = host.to(self.device)
        ints, floats, flags = _views(upload, arrays, spans)
        pairs = {k: t for k, t in _no_pairs(self.device).items() if k != "logprob_rows"}
        meta = SamplingMetadata(**_dense_fields(ints, floats, flags), **pairs, any_drawn=drawn,
                                any_filtered=filtered, any_adjusted=False)
        x = self.logits[:bucket]
        try:
            tokens, replay = self.recorder(lambda: self.ops.sample_tokens(x, meta))
        except RuntimeError as exc:  # an op that cannot be recorded: sample eagerly from now on
            logger.warning("sampling graphs: recording %s failed, sampling runs eagerly: %s", key, exc)
            self.failed = True
            return None
        graph = _SamplingGraph(upload, tokens, replay)
        self.graphs[key] = graph
        return graph


def sampling_metadata(
    rows: Sequence[SampleRow], vocab: int, eos_token_id: int | None, device: torch.device
) -> tuple[SamplingMetadata, torch.Tensor]:
    """The step's `SamplingMetadata` and the device indices of the rows that want logprobs, built on
    the host and moved in one copy. Each row's columns come from its params (`sampler_row`, computed
    once per request) and are laid out by numpy straight into the copy's buffer; only rows with a bias,
    a min_tokens ban, penalties or logprobs go through the per-row part, and a step without any shares
    one set of empty device tensors for the (row, token) pair fields."""
    return _metadata(rows, *_dense_table(rows), vocab, eos_token_id, device)


def _metadata(rows: Sequence[SampleRow], table: np.ndarray, special: list[int], vocab: int,
              eos_token_id: int | None, device: torch.device) -> tuple[SamplingMetadata, torch.Tensor]:
    """`sampling_metadata` from the rows' `_dense_table` (which the per-row part edits)."""
    sparse = _sparse_fields(rows, special, table, eos_token_id) if special else None
    ints, floats, flags = _dense_arrays(table, [r.seed for r in rows], [r.position for r in rows], vocab)
    parts = copy_to_device([ints, floats, flags, *(sparse.values() if sparse else ())], device)
    fields = _dense_fields(*parts[:3])
    fields.update(zip(sparse, parts[3:], strict=True) if sparse else _no_pairs(device).items())
    logprob_rows = fields.pop("logprob_rows")
    drawn, filtered = _kind(flags)
    meta = SamplingMetadata(
        **fields,
        any_drawn=drawn,
        any_filtered=filtered,
        any_adjusted=sparse is not None and any(sparse[k].size for k in _ADJUSTING),
    )
    return meta, logprob_rows


def _dense_table(rows: Sequence[SampleRow]) -> tuple[np.ndarray, list[int]]:
    """Each row's `sampler_row` columns [rows, len(_DENSE)] and the rows that need the per-row part."""
    dense, special = [], []
    for i, r in enumerate(rows):
        row, extra = r.params.sampler_row
        dense.append(row)
        if extra:
            special.append(i)
    return np.array(dense, dtype=np.float64).reshape(len(rows), len(_DENSE)), special


def _dense_arrays(table: np.ndarray, seeds: Sequence[int], positions: Sequence[int], vocab: int
                  ) -> list[np.ndarray]:
    """The per-row fields grouped by dtype, one [fields, rows] array each: int64 (top_k, seeds,
    positions), float32 (_FLOAT_FIELDS), bool (greedy, filtered)."""
    top_k = table[:, _DENSE.index("top_k")]
    ints = np.stack([np.where(top_k > 0, top_k, vocab).astype(np.int64), np.array(seeds, dtype=np.int64),
                     np.array(positions, dtype=np.int64)])
    floats = np.ascontiguousarray(table[:, : len(_FLOAT_FIELDS)].T, dtype=np.float32)
    flags = np.ascontiguousarray(table[:, _DENSE.index("greedy") :].T != 0)
    return [ints, floats, flags]


def _kind(flags: np.ndarray) -> tuple[bool, bool]:
    """(any drawn row, any filtered row) of a step from its `_dense_arrays` flags."""
    return not bool(flags[0].all()), bool(flags[1].any())


def _dense_fields(ints: torch.Tensor, floats: torch.Tensor, flags: torch.Tensor) -> dict[str, torch.Tensor]:
    """SamplingMetadata's per-row fields from the device views of `_dense_arrays`."""
    fields = dict(zip(("top_k", "seeds", "positions"), ints.unbind(0), strict=True))
    fields.update(zip(_FLOAT_FIELDS, floats.unbind(0), strict=True))
    fields["greedy"], fields["filtered"] = flags.unbind(0)
    return fields


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
    host, spans = _pack(arrays, pin=device.type == "cuda")
    return _views(host.to(device, non_blocking=True), arrays, spans)


def _pack(arrays: Sequence[np.ndarray], pin: bool) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The arrays' bytes in one host buffer, each part 8-byte aligned, and each part's (offset, bytes)."""
    spans, offset = [], 0
    for a in arrays:
        spans.append((offset, a.nbytes))
        offset += a.nbytes + -a.nbytes % 8
    # written in place through numpy: no per-part tensors, and on CUDA no second copy into pinned memory
    buf = torch.empty(offset, dtype=torch.uint8, pin_memory=pin)
    host = buf.numpy()
    for a, (o, n) in zip(arrays, spans, strict=True):
        if n:
            host[o : o + n] = a.reshape(-1).view(np.uint8)
    return buf, spans


def _views(buf: torch.Tensor, arrays: Sequence[np.ndarray], spans: list[tuple[int, int]]
           ) -> list[torch.Tensor]:
    return [buf[o : o + n].view(_TORCH_DTYPES[a.dtype]).view(a.shape)
            for a, (o, n) in zip(arrays, spans, strict=True)]


_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.float32): torch.float32,
                 np.dtype(np.bool_): torch.bool}
