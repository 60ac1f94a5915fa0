"""Batch-invariance checks (shared by the GPU and Triton-interpreter tests): a probe sequence's logits
alone and in batches of companion sequences, through a DeepSeek-V4.1 runtime."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.models.deepseek_v41.graphs import DecodeGraphs
from deepinfer.models.deepseek_v41.metadata import FixedShape
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime
from deepinfer.models.interface import ForwardBatch, ForwardOutput, SequenceSegment


@dataclass(frozen=True)
class Scenario:
    """Companion prompt lengths prefilled in the probe's first step (`first`) or in its second (`late`:
    a prefill sharing a decode step), each decoding beside it afterwards; the probe is segment `at`."""

    first: tuple[int, ...] = ()
    late: tuple[int, ...] = ()
    at: int = 0

    def decode_only(self, decode: int) -> list[bool]:
        """Per step, whether every sequence brings one token (the steps CUDA graphs replay): all but
        the probe's prefill and the step a late prefill joins."""
        return [step > 0 and not (step == 1 and self.late) for step in range(decode + 1)]


# the GPU slice test's probe and batches (its CPU twin checks which graph each step replays)
PROBE_LEN, DECODE = 150, 3
SCENARIOS = {
    "3 seqs (bucket 4)": Scenario((37, 200)),
    "8 seqs, probe 4th (bucket 8)": Scenario((90, 12, 64, 150, 33, 5, 128), at=3),
    "prefill joins a decode step": Scenario((70,), late=(260,), at=1),
}


@dataclass(frozen=True)
class ProbeRun:
    logits: list[torch.Tensor]  # the probe's row per step
    graphs: list[FixedShape | None]  # per step, the key of the graph it replayed; None: it ran eagerly


class _ReplayLog:
    """Stands in for a runtime's DecodeGraphs during a probe run, noting the key of the graph each step
    replayed (the runtime offers every step to `forward` first)."""

    def __init__(self, graphs: DecodeGraphs) -> None:
        self.graphs = graphs
        self.replayed: FixedShape | None = None

    def forward(self, batch: ForwardBatch) -> ForwardOutput | None:
        out = self.graphs.forward(batch)
        self.replayed = self.graphs.shape(batch) if out is not None else None
        return out


def allocate(runtime: DeepseekV41Runtime, longest: int, slots: int) -> None:
    """A cache for `slots` sequences of up to `longest` tokens (slot 0 unused, block 0 the padding one)."""
    per_seq = -(-longest // runtime.cache_layout().block_size)
    runtime.allocate_cache(1 + slots * per_seq, slots + 1)


def run_probe(
    runtime: DeepseekV41Runtime, scenario: Scenario, probe_len: int, decode: int, graphs: bool = True
) -> ProbeRun:
    """The probe's logits per step: its prefill (last position), then `decode` teacher-forced steps, and
    the graph each step replayed. Tokens are drawn from a fixed seed, so every call with the same lengths
    sees the same sequences. `graphs` False runs every step eagerly (CUDA graphs, where the runtime has
    them, set aside)."""
    gen = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, runtime.vocab_size, (n,), generator=gen).tolist()

    probe, forced = tokens(probe_len), tokens(decode)
    prompts = [tokens(n) for n in scenario.first + scenario.late]
    longest = max([probe_len, *scenario.first, *scenario.late]) + decode + 1
    per_seq = -(-longest // runtime.cache_layout().block_size)
    slots = range(1, 2 + len(prompts))
    table = {s: list(range(1 + (s - 1) * per_seq, 1 + s * per_seq)) for s in slots}
    pos = dict.fromkeys(slots, 0)  # tokens in the cache per slot
    for s in slots:
        runtime.reset_slot(s)
    late = range(2 + len(scenario.first), 2 + len(prompts))
    saved = runtime.graphs
    log = _ReplayLog(saved) if graphs and saved is not None else None
    runtime.graphs = log  # type: ignore[assignment]  # forward() is all the runtime calls on it
    out, keys = [], []
    try:
        for step in range(decode + 1):
            segs = [SequenceSegment(s, table[s], pos[s], prompts[s - 2] if pos[s] == 0 else [11 + s])
                    for s in slots[1:] if step > 0 or s not in late]
            at = min(scenario.at, len(segs))
            segs.insert(at, SequenceSegment(1, table[1], pos[1], probe if step == 0 else [forced[step - 1]]))
            result = runtime.forward(ForwardBatch(segs))
            out.append(result.logits[result.row_offsets[at]].clone())
            keys.append(log.replayed if log is not None else None)
            for seg in segs:
                pos[seg.slot] += len(seg.token_ids)
    finally:
        runtime.graphs = saved
    return ProbeRun(out, keys)


def probe_logits(
    runtime: DeepseekV41Runtime, scenario: Scenario, probe_len: int, decode: int, graphs: bool = True
) -> list[torch.Tensor]:
    """run_probe's logits alone."""
    return run_probe(runtime, scenario, probe_len, decode, graphs).logits


def differing_steps(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if not torch.equal(a, b)]
