"""Speculative decoding end to end: mean accepted length and acceptance rate per draft length K, and
tokens per second with and without speculation, at several batch sizes (offline `LLM.generate`).

    python benchmarks/spec_decode.py [--model DIR] [--speculators dspark,ngram] [--ks 1,2,3,4,5]
        [--batches 1,8] [--max-tokens 64] [--temperature 0] [--schedules fixed] [--json-out FILE]

Without --model it writes the tiny `full` config with random weights (DSpark block size 4) to a
temporary directory: the machinery is measured, the acceptance of a random draft model is not
meaningful. Requests ignore EOS, so every one generates --max-tokens tokens. Per-user tok/s is the
mean over requests of output tokens / (finish - arrival) seconds; throughput is all output tokens
over the wall time of the generate call; tok_per_cpu_s divides by the process's CPU time instead (what
a shared, loaded machine distorts least). K above the DSpark block size is skipped for dspark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from deepinfer.entrypoints.llm import LLM
from deepinfer.sampling import SamplingParams
from deepinfer.speculators import registry

# prompts with some repetition, as real text and code have (what prompt lookup feeds on)
TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
    "import os\nimport sys\nfor name in os.listdir(sys.argv[1]):\n    print(name)\n",
    "Speculative decoding drafts several tokens and verifies them in one forward pass of the model.",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,",
    "Once upon a time there was a small village by the sea. Every morning the fishermen",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY age DESC; SELECT name FROM",
]


def ensure_speculators() -> None:
    """Register deepinfer-spec's plugins directly when the installed metadata predates its entry
    points (an editable install not re-synced since they were added)."""
    if {"dspark", "ngram"} <= set(registry.available_speculators()):
        return
    from deepinfer_spec.dspark import DSparkProposer
    from deepinfer_spec.ngram import NgramProposer

    found = {**registry.available_speculators(), "dspark": DSparkProposer, "ngram": NgramProposer}
    registry.available_speculators = lambda: found


def prompts(llm: LLM, batch: int) -> list[Any]:
    if llm.tokenizer is not None:
        return [TEXTS[i % len(TEXTS)] for i in range(batch)]
    vocab = llm.engine.vocab_size
    return [[5 + (7 * i + 3 * (j % 11)) % (vocab - 5) for j in range(40)] for i in range(batch)]


def measure(model: Path, batch: int, params: SamplingParams, **engine: Any) -> dict[str, Any]:
    llm = LLM(model, max_num_seqs=batch, log_stats_interval=0, **engine)
    try:
        warm_up = SamplingParams(temperature=0, max_tokens=4)
        llm.generate(prompts(llm, batch), warm_up, use_tqdm=False)
        stats = llm.engine.stats

        def counters() -> tuple[int, int, int]:
            return stats.spec_verify_steps, stats.spec_draft_tokens, stats.spec_accepted_tokens

        before = counters()
        start, cpu_start = time.perf_counter(), time.process_time()
        outs = llm.generate(prompts(llm, batch), params, use_tqdm=False)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        steps, drafted, accepted = (now - b for now, b in zip(counters(), before, strict=True))
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        per_user = [len(o.outputs[0].token_ids) / (o.metrics.finish_time - o.metrics.arrival_time)
                    for o in outs]
        return {
            "batch": batch, "tokens": tokens, "wall_s": round(wall, 3),
            "throughput_tok_s": round(tokens / wall, 1),
            "cpu_s": round(cpu, 3), "tok_per_cpu_s": round(tokens / cpu, 1),
            "per_user_tok_s": round(statistics.mean(per_user), 1),
            "mean_accepted_length": round(1 + accepted / steps, 3) if steps else None,
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        }
    finally:
        llm.engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--speculators", default="dspark,ngram")
    ap.add_argument("--ks", default="1,2,3,4,5")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--schedules", default="fixed", help="comma list of fixed, confidence")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    ensure_speculators()
    model = args.model
    if model is None:
        from deepinfer.testing import write_tiny_checkpoint

        model = write_tiny_checkpoint("full", tempfile.mkdtemp(prefix="spec-bench-"), seed=0)
    block = json.loads((model / "config.json").read_text())["text_config"].get("dspark_block_size") or 0
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True, seed=1)
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        base = measure(model, batch, params)
        results.append({"speculator": "none", "k": 0, "schedule": "-", **base})
        print(json.dumps(results[-1]), flush=True)
        for name in args.speculators.split(","):
            for k in (int(k) for k in args.ks.split(",")):
                if name == "dspark" and k > block:
                    continue
                for schedule in args.schedules.split(","):
                    r = measure(model, batch, params, speculator=name, num_draft_tokens=k,
                                spec_schedule=schedule)
                    r["speedup"] = round(r["throughput_tok_s"] / base["throughput_tok_s"], 3)
                    r["cpu_speedup"] = round(r["tok_per_cpu_s"] / base["tok_per_cpu_s"], 3)
                    results.append({"speculator": name, "k": k, "schedule": schedule, **r})
                    print(json.dumps(results[-1]), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
