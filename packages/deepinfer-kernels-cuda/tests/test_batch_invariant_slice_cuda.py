"""Batch-invariant mode on the GPU: a probe sequence's logits are bitwise the same alone and in batches.

* A Flash-width slice (2 layers: SWA + Engram, C2 with indexer; 64 experts, a 10k-token Engram
  vocabulary; bf16, release cache; weights from benchmarks/reference_forward.py), cuda backend in
  batch-invariant mode: the probe's prefill and
  teacher-forced decode logits alone, then in three batches (companions prefilled beside it and decoding
  with it: 3 sequences = graph bucket 4 with a padding row, 8 = bucket 8 with the probe in the middle,
  and a companion whose prefill joins a decode step), eagerly and through CUDA graphs (every one-token
  step must replay one; which key each step maps to is checked on the CPU by deepinfer-core's
  test_invariance_probe.py), and in a second runtime built from the same weights (a second run).
* Through the engine (LLM on checkpoints/tiny-stdlib, greedy): the probe's tokens and logprobs alone and
  in three batches of other prompts.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from deepinfer.entrypoints.llm import LLM
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.ops import get_ops
from deepinfer.sampling import SamplingParams
from deepinfer.testing.configs import flash_slice_config
from deepinfer.testing.invariance import (
    DECODE,
    PROBE_LEN,
    SCENARIOS,
    Scenario,
    allocate,
    differing_steps,
    probe_logits,
    run_probe,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,  # draws a Flash-width slice and compiles every kernel: a minute or two
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).resolve().parents[3]
SLOTS = 10


def _reference_forward():
    path = ROOT / "benchmarks" / "reference_forward.py"
    spec = importlib.util.spec_from_file_location("reference_forward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tokens(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


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
        allocate(rt, 300 + DECODE + 1, SLOTS)
        return rt

    return runtime


def _run(runtime: DeepseekV41Runtime, name: str, scenario: Scenario, graphs: bool,
         logits: dict[str, list[torch.Tensor]], unreplayed: dict[str, list]) -> None:
    """Record the probe's logits under `name`; with graphs, note the run if a one-token step ran eagerly
    (a capture that failed or a key the step missed would leave the graphs untested)."""
    run = run_probe(runtime, scenario, PROBE_LEN, DECODE, graphs)
    logits[name] = run.logits
    if graphs and [key is not None for key in run.graphs] != scenario.decode_only(DECODE):
        unreplayed[name] = run.graphs


def test_probe_logits_bitwise_alone_and_in_batches_eager_graphs_and_runs(slice_setup):
    runtime = slice_setup()
    alone = probe_logits(runtime, Scenario(), PROBE_LEN, DECODE, graphs=False)
    assert all(torch.isfinite(x).all() for x in alone)
    results: dict[str, list[torch.Tensor]] = {}
    unreplayed: dict[str, list] = {}  # graph runs with a one-token step that ran eagerly: graph key per step
    _run(runtime, "alone, graphs", Scenario(), True, results, unreplayed)
    for name, scenario in SCENARIOS.items():
        for graphs in (False, True):
            _run(runtime, f"{name}, {'graphs' if graphs else 'eager'}", scenario, graphs, results, unreplayed)
    del runtime
    _run(slice_setup(), "alone, second run", Scenario(), True, results, unreplayed)
    # per run, the steps whose logits differ from alone, eager
    differing = {name: differing_steps(got, alone) for name, got in results.items()}
    print(f"batch-invariant slice: {len(results)} runs x {DECODE + 1} steps, differing steps: {differing}")
    assert not any(differing.values()), differing
    assert not unreplayed, f"one-token steps that ran eagerly (graph key per step): {unreplayed}"


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
