"""Batch-invariance checks (shared by the GPU and Triton-interpreter tests): a probe sequence's logits
alone and in batches of companion sequences, through a DeepSeek-V4.1 runtime."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment


@dataclass(frozen=True)
class Scenario:
    """Companion prompt lengths prefilled in the probe's first step (`first`) or in its second (`late`:
    a prefill sharing a decode step), each decoding beside it afterwards; the probe is segment `at`."""

    first: tuple[int, ...] = ()
    late: tuple[int, ...] = ()
    at: int = 0


def allocate(runtime: DeepseekV41Runtime, longest: int, slots: int) -> None:
    """A cache for `slots` sequences of up to `longest` tokens (slot 0 unused, block 0 the padding one)."""
    per_seq = -(-longest // runtime.cache_layout().block_size)
    runtime.allocate_cache(1 + slots * per_seq, slots + 1)


def probe_logits(
    runtime: DeepseekV41Runtime, scenario: Scenario, probe_len: int, decode: int, graphs: bool = True
) -> list[torch.Tensor]:
    """The probe's logits per step: its prefill (last position), then `decode` teacher-forced steps.
    Tokens are drawn from a fixed seed, so every call with the same lengths sees the same sequences.
    `graphs` False runs every step eagerly (CUDA graphs, where the runtime has them, set aside)."""
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
    if not graphs:
        runtime.graphs = None
    out = []
    try:
        for step in range(decode + 1):
            segs = [SequenceSegment(s, table[s], pos[s], prompts[s - 2] if pos[s] == 0 else [11 + s])
                    for s in slots[1:] if step > 0 or s not in late]
            at = min(scenario.at, len(segs))
            segs.insert(at, SequenceSegment(1, table[1], pos[1], probe if step == 0 else [forced[step - 1]]))
            result = runtime.forward(ForwardBatch(segs))
            out.append(result.logits[result.row_offsets[at]].clone())
            for seg in segs:
                pos[seg.slot] += len(seg.token_ids)
    finally:
        runtime.graphs = saved
    return out


def differing_steps(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if not torch.equal(a, b)]
