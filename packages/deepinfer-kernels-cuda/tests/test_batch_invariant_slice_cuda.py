"""Batch-invariant mode on the GPU: a probe sequence's logits are bitwise the same alone and in batches.

* A Flash-width slice (2 layers: SWA + Engram, C2 with indexer; 64 experts, a 10k-token Engram
  vocabulary; bf16, release cache; weights from benchmarks/reference_forward.py), cuda backend in
  batch-invariant mode: the probe's prefill and
  teacher-forced decode logits alone, then in three batches (companions prefilled beside it and decoding
  with it: 3 sequences = graph bucket 4 with a padding row, 8 = bucket 8 with the probe in the middle,
  and a companion whose prefill joins a decode step), eagerly and through CUDA graphs, and in a second
  runtime built from the same weights (a second run).
* Through the engine (LLM on checkpoints/tiny-stdlib, greedy): the probe's tokens and logprobs alone and
  in three batches of other prompts.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from deepinfer.entrypoints.llm import LLM
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import get_ops
from deepinfer.sampling import SamplingParams
from deepinfer.testing.configs import flash_slice_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).resolve().parents[3]
PROBE_LEN, DECODE, SLOTS = 150, 3, 10


def _reference_forward():
    path = ROOT / "benchmarks" / "reference_forward.py"
    spec = importlib.util.spec_from_file_location("reference_forward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tokens(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


class Scenario:
    """Companion prompts prefilled in the probe's first step (`first`) or in its second (`late`: a mixed
    step), each decoding beside it afterwards; the probe sits at index `at` of each step's segments."""

    def __init__(self, first: list[int], late: list[int] = (), at: int = 0):
        self.first, self.late, self.at = first, list(late), at


def _probe_logits(runtime: DeepseekV41Runtime, scenario: Scenario, graphs: bool) -> list[torch.Tensor]:
    """The probe's logits per step: its prefill (last position), then DECODE teacher-forced steps."""
    gen = torch.Generator().manual_seed(0)
    vocab = runtime.vocab_size
    probe, forced = _tokens(gen, PROBE_LEN, vocab), _tokens(gen, DECODE, vocab)
    prompts = [_tokens(gen, n, vocab) for n in scenario.first + scenario.late]
    longest = max([PROBE_LEN, *scenario.first, *scenario.late])
    per_seq = -(-(longest + DECODE + 1) // runtime.cache_layout().block_size)
    saved = runtime.graphs
    if not graphs:
        runtime.graphs = None
    pos = {}  # slot -> tokens in the cache
    for slot in range(1, 2 + len(prompts)):
        runtime.reset_slot(slot)
        pos[slot] = 0
    table = {slot: list(range(1 + (slot - 1) * per_seq, 1 + slot * per_seq)) for slot in pos}
    late_slots = range(2 + len(scenario.first), 2 + len(prompts))
    out = []
    try:
        for step in range(DECODE + 1):
            segs = []
            for slot in range(2, 2 + len(prompts)):
                if slot in late_slots and step == 0:
                    continue
                new = prompts[slot - 2] if pos[slot] == 0 else [11 + slot]
                segs.append(SequenceSegment(slot, table[slot], pos[slot], new))
            mine = probe if step == 0 else [forced[step - 1]]
            at = min(scenario.at, len(segs))
            segs.insert(at, SequenceSegment(1, table[1], pos[1], mine))
            result = runtime.forward(ForwardBatch(segs))
            out.append(result.logits[result.row_offsets[at]].clone())
            for seg in segs:
                pos[seg.slot] += len(seg.token_ids)
    finally:
        runtime.graphs = saved
    return out


@pytest.fixture(scope="module")
def slice_setup():
    rf = _reference_forward()
    # a 10k-token Engram vocabulary: drawing the default 100k one's 2.4M table rows takes ~20 s of CPU
    config = flash_slice_config(num_layers=2, n_routed_experts=64, dspark_n_routed_experts=16,
                                engram_vocab_size=10_000)
    tensors = rf.random_weights(config, torch.device("cuda"))

    def runtime() -> DeepseekV41Runtime:
        rt = build_runtime(config, dict(tensors), dtype=torch.bfloat16,
                           ops=get_ops("cuda", "cuda", batch_invariant=True),
                           engram_token_map=rf.token_map(config),
                           options=RuntimeOptions(cache_precision="release", batch_invariant=True))
        per_seq = -(-(2 * PROBE_LEN + DECODE + 1) // rt.cache_layout().block_size)
        rt.allocate_cache(1 + SLOTS * per_seq, SLOTS + 1)
        return rt

    return runtime


SCENARIOS = {
    "3 seqs (bucket 4)": Scenario([37, 200]),
    "8 seqs, probe 4th (bucket 8)": Scenario([90, 12, 64, 150, 33, 5, 128], at=3),
    "prefill joins a decode step": Scenario([70], late=[260], at=1),
}


def test_probe_logits_bitwise_alone_and_in_batches_eager_graphs_and_runs(slice_setup):
    runtime = slice_setup()
    alone = _probe_logits(runtime, Scenario([]), graphs=False)
    assert all(torch.isfinite(x).all() for x in alone)
    results = {"alone, graphs": _probe_logits(runtime, Scenario([]), graphs=True)}
    for name, scenario in SCENARIOS.items():
        for graphs in (False, True):
            results[f"{name}, {'graphs' if graphs else 'eager'}"] = _probe_logits(runtime, scenario, graphs)
    assert not runtime.graphs.failed and len(runtime.graphs.graphs) >= 3  # buckets 1, 4, 8 were replayed
    del runtime
    results["alone, second run"] = _probe_logits(slice_setup(), Scenario([]), graphs=True)
    differing = {name: [i for i, (a, b) in enumerate(zip(got, alone, strict=True)) if not torch.equal(a, b)]
                 for name, got in results.items()}  # step indices whose logits differ from alone, eager
    print(f"batch-invariant slice: {len(results)} runs x {DECODE + 1} steps, differing steps: {differing}")
    assert not any(differing.values()), differing


def test_engine_probe_tokens_and_logprobs_bitwise_in_batches():
    llm = LLM(ROOT / "checkpoints" / "tiny-stdlib", backend="cuda", batch_invariant=True, max_num_seqs=16,
              max_model_len=512)
    try:
        gen = torch.Generator().manual_seed(1)
        vocab = llm.engine.vocab_size
        probe = _tokens(gen, 40, vocab)
        params = SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True)

        def run(prompts: list[list[int]], at: int) -> tuple:
            prompts = [*prompts[:at], probe, *prompts[at:]]
            out = llm.generate(prompts, params)[at].outputs[0]
            return out.token_ids, out.logprobs

        alone = run([], 0)
        batches = {"3": ([_tokens(gen, n, vocab) for n in (9, 100)], 0),
                   "6": ([_tokens(gen, n, vocab) for n in (3, 70, 5, 31, 200)], 2),
                   "11": ([_tokens(gen, n, vocab) for n in range(7, 300, 29)], 5)}
        for name, (companions, at) in batches.items():
            assert run(companions, at) == alone, f"batch of {name}"
    finally:
        llm.close()
