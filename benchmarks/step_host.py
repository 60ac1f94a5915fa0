"""Host (CPU) work of one decode / verification step, part by part, without a GPU.

The model-side part is the step metadata build of the DeepSeek-V4.1 runtime (metadata.MetadataBuilder)
at the Flash-width slice's geometry (window 128, compress ratios 1 and 2, Engram 4-grams, DSpark
backtrack): eager steps (own staging) and fixed-shape steps (what a CUDA-graph replay builds, into a
persistent staging buffer), and the whole host side of a graph step (graphs.DecodeGraphs.forward with
a no-op replay: graph key, fixed build, token ids, logits copied out). Device tensors play no part
in the host cost, so the cache is allocated on the meta device and staging copies land in CPU memory
(a real memcpy here; from pinned memory to a GPU the copy is asynchronous). The engine-side part
(scheduler and output processing on the engine thread) comes from benchmarks/engine_overhead.py with
a constant-logits model.

    python benchmarks/step_host.py --batches 1,8,64,256 --contexts 2048,8192,65536 --tokens 1,4
    python benchmarks/step_host.py --batches 64 --contexts 8192 --tokens 1 --profile   # cProfile top 25
    python benchmarks/step_host.py ... --parts    # also the fixed build part by part
    python benchmarks/step_host.py --prefill 2048  # the eager build of one 2048-token prefill instead
    python benchmarks/step_host.py --prefill 2048 --against HEAD~1  # and metadata.py of that revision,
                                                                     # interleaved in the same run
    python benchmarks/step_host.py --against HEAD~1 --engine-steps 0  # eager builds vs that revision's too

Times are medians over --repeat builds of the thread's CPU time (microseconds; CPU time rather than
wall-clock time so that other processes on a loaded machine count less), positions advancing by n
each step (block tables growing as they would), after warm-up builds.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from deepinfer.cache import BLOCK_TOKENS, KVCache
from deepinfer.models.deepseek_v41 import metadata
from deepinfer.models.deepseek_v41.graphs import DecodeGraphs
from deepinfer.models.deepseek_v41.metadata import FixedShape, MetadataBuilder, Staging
from deepinfer.models.deepseek_v41.step_state import BoundedReplay, step_geometry
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing.configs import flash_slice_config

sys.path.insert(0, str(Path(__file__).parent))
from engine_overhead import measure as engine_measure

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


def flash_builder(max_batch: int, max_context: int) -> MetadataBuilder:
    cfg = flash_slice_config(num_layers=5).text
    backtrack = cfg.dspark_block_size + 1
    blocks = max_batch * (-(-(max_context + 64) // BLOCK_TOKENS)) + 1
    cache = KVCache(cfg, blocks, max_batch + 1, "release", torch.bfloat16, backtrack, torch.device("meta"))
    n = cfg.engram_max_ngram_size
    geo = step_geometry(cfg, cache, BoundedReplay(), n, backtrack + n - 1)
    return MetadataBuilder(geo, "cpu")


class Steps:
    """`batch` sequences at about `context` tokens, each step bringing `tokens` new ones."""

    def __init__(self, batch: int, context: int, tokens: int):
        self.tokens = tokens
        self.pos = [context - (i * 37) % 97 for i in range(batch)]  # ragged, as real batches are
        self.tables = []
        next_block = 1
        for p in self.pos:
            n = -(-(p + tokens) // BLOCK_TOKENS)
            self.tables.append(list(range(next_block, next_block + n)))
            next_block += n + 4  # room to grow
        self.logits = "last" if tokens == 1 else "all"

    def batch(self) -> ForwardBatch:
        """The engine's ForwardBatch construction (model_runner.ModelRunner.execute)."""
        n = self.tokens
        return ForwardBatch([SequenceSegment(i + 1, t, p, [7] * n, self.logits)
                             for i, (t, p) in enumerate(zip(self.tables, self.pos, strict=True))])

    def advance(self) -> None:
        for i, t in enumerate(self.tables):
            self.pos[i] += self.tokens
            if len(t) * BLOCK_TOKENS < self.pos[i] + self.tokens:
                t.append(t[-1] + 1)


def median_us(fn: Callable[[], object], repeat: int, between: Callable[[], None] | None = None) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        if between:
            between()
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return 1e6 * statistics.median(times)


def fixed_shape(batch: ForwardBatch, tokens: int) -> FixedShape:
    width = 1 << max(max(len(s.block_table) for s in batch.segments) - 1, 0).bit_length()
    num_seqs = next(b for b in BUCKETS if b >= len(batch.segments))
    return FixedShape(num_seqs, tokens, width, batch.segments[0].logits)  # type: ignore[arg-type]


def measure(builder: MetadataBuilder, batch: int, context: int, tokens: int, repeat: int) -> dict:
    steps = Steps(batch, context, tokens)
    persistent = Staging(torch.device("cpu"), persistent=True)
    holder: dict[str, ForwardBatch] = {}

    def next_step() -> None:
        steps.advance()
        holder["b"] = steps.batch()

    next_step()
    # a graph step's host side: graph key, fixed build, ids, (no-op) replay, logits copied out
    graphs = DecodeGraphs(builder=builder, last_layer_is_consumer=False, vocab_size=8,
                          step=lambda meta, ids: torch.zeros(len(meta.logits_rows), 8),
                          recorder=lambda step: (step(), lambda: None))
    row = {
        "batch": median_us(steps.batch, repeat),
        "graph": median_us(lambda: graphs.forward(holder["b"]), repeat, next_step),
        "eager": median_us(lambda: builder.build(holder["b"], False), repeat, next_step),
        "fixed": median_us(lambda: builder.build(holder["b"], False, fixed_shape(holder["b"], tokens),
                                                 persistent), repeat, next_step),
    }
    return row


# parts of a fixed-shape build: (owner, function) -> column; the rest of the build is "other"
PARTS = {
    "checks": ("_check_segments", metadata),
    "tables": ("update", getattr(metadata, "SlotTables", None)),
    "window": ("_window", getattr(metadata, "FixedPlan", None)),
    "entries": ("_compression", getattr(metadata, "FixedPlan", None)),
    "engram": ("_engram", getattr(metadata, "FixedPlan", None)),
    "copy": ("send", Staging),
}


def measure_parts(builder: MetadataBuilder, batch: int, context: int, tokens: int, repeat: int) -> dict:
    """Median CPU us per fixed-shape build of each part (timed through wrappers, which add ~0.3 us per
    call: "tables" runs once per sequence)."""
    spent: dict[str, float] = {}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args: object, **kwargs: object) -> object:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - t0
        return wrapper

    present = {k: (attr, owner) for k, (attr, owner) in PARTS.items() if hasattr(owner, attr)}
    saved = {k: getattr(owner, attr) for k, (attr, owner) in present.items()}
    for k, (attr, owner) in present.items():
        setattr(owner, attr, timed(k, saved[k]))
    try:
        steps = Steps(batch, context, tokens)
        persistent = Staging(torch.device("cpu"), persistent=True)
        per_part: dict[str, list[float]] = {k: [] for k in [*present, "total"]}
        for i in range(repeat + 3):
            steps.advance()
            b = steps.batch()
            spent.clear()
            t0 = time.thread_time()
            builder.build(b, False, fixed_shape(b, tokens), persistent)
            total = time.thread_time() - t0
            if i >= 3:
                for k in present:
                    per_part[k].append(spent.get(k, 0.0))
                per_part["total"].append(total)
    finally:
        for k, (attr, owner) in present.items():
            setattr(owner, attr, saved[k])
    return {k: 1e6 * statistics.median(v) for k, v in per_part.items()}


def profile(builder: MetadataBuilder, batch: int, context: int, tokens: int, repeat: int) -> None:
    steps = Steps(batch, context, tokens)
    persistent = Staging(torch.device("cpu"), persistent=True)
    prof = cProfile.Profile()
    for _ in range(repeat):
        steps.advance()
        b = steps.batch()
        prof.enable()
        builder.build(b, False, fixed_shape(b, tokens), persistent)
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def metadata_at(rev: str) -> object:
    """metadata.py as of git revision `rev`, loaded as a separate module (for same-run comparisons)."""
    path = "packages/deepinfer-core/src/deepinfer/models/deepseek_v41/metadata.py"
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, check=True, capture_output=True,
                          text=True).stdout
    spec = importlib.util.spec_from_loader(f"metadata_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(text, f"{rev}:{path}", "exec"), module.__dict__)
    return module


def prefill_batches(tokens: int) -> dict[str, ForwardBatch]:
    """Eager prefill-like steps: one `tokens`-token prompt from position 0, the same as a later chunk,
    and a mixed batch (the prompt's chunk beside 32 decoding sequences)."""
    blocks = -(-(2 * tokens) // BLOCK_TOKENS)
    prompt = [SequenceSegment(1, list(range(1, blocks + 1)), 0, [7] * tokens)]
    chunk = [SequenceSegment(1, list(range(1, blocks + 1)), tokens + 5, [7] * (tokens - 10))]
    decode = [SequenceSegment(2 + i, list(range(100 + 40 * i, 140 + 40 * i)), 3000 + 37 * i, [7])
              for i in range(32)]
    return {"prefill": ForwardBatch(prompt), "chunk": ForwardBatch(chunk),
            "mixed": ForwardBatch(prompt + decode)}


def eager_against_us(geo: metadata.StepGeometry, batch: int, context: int, tokens: int, repeat: int,
                     against: object) -> tuple[float, float]:
    """Median CPU us of eager builds of the same steps by this metadata.py and by `against` (a module from
    `metadata_at`), timed in turn (CPU device: staging copies into host memory)."""
    steps = Steps(batch, context, tokens)
    then = against.MetadataBuilder(against.StepGeometry(**vars(geo)), "cpu")
    builders = [MetadataBuilder(geo, "cpu"), then]
    times: list[list[float]] = [[], []]
    for i in range(repeat + 5):
        steps.advance()
        b = steps.batch()
        for k, builder in enumerate(builders):
            t0 = time.thread_time()
            builder.build(b, False)
            if i >= 5:
                times[k].append(time.thread_time() - t0)
    return 1e6 * statistics.median(times[0]), 1e6 * statistics.median(times[1])


def prefill_build_us(tokens: int, repeat: int, against: str | None = None) -> dict[str, dict[str, float]]:
    """Median CPU us of the eager builds of `prefill_batches` at the Flash slice's geometry, into a builder on
    the meta device: the host's work, the device's ops not run (a CUDA build copies and launches
    asynchronously); with `against`, also metadata.py of that revision, the two timed in turn."""
    geo = flash_builder(40, 2 * tokens).geo
    geo = metadata.StepGeometry(geo.window, geo.ring_len, 40, geo.state_lens, geo.ratios, geo.replay,
                                geo.engram_n, geo.history_len)
    modules = {"now": metadata}
    if against:
        modules[against] = metadata_at(against)
    builders = {k: m.MetadataBuilder(m.StepGeometry(**vars(geo)), "meta") for k, m in modules.items()}
    times: dict[str, dict[str, list[float]]] = {k: {} for k in builders}
    for name, batch in prefill_batches(tokens).items():
        for b in builders.values():
            for _ in range(3):
                b.build(batch, False)
        for _ in range(repeat):
            for k, b in builders.items():
                t0 = time.thread_time()
                b.build(batch, False)
                times[k].setdefault(name, []).append(time.thread_time() - t0)
    return {k: {name: 1e6 * statistics.median(v) for name, v in per.items()} for k, per in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--contexts", default="2048,8192,65536")
    parser.add_argument("--tokens", default="1,4", help="new tokens per sequence: 1 decode, >1 verification")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--engine-steps", type=int, default=30, help="0: skip the engine-side part")
    parser.add_argument("--profile", action="store_true", help="cProfile the fixed-shape build instead")
    parser.add_argument("--parts", action="store_true", help="also time the parts of the fixed-shape build")
    parser.add_argument("--prefill", type=int, default=0, help="time the eager build of one N-token prefill")
    parser.add_argument("--against", default=None, help="also time this git revision's eager builds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.prefill:
        print(f"eager builds around one {args.prefill}-token prefill (Flash slice geometry, host work only), "
              f"median us of {args.repeat}")
        for k, row in prefill_build_us(args.prefill, args.repeat, args.against).items():
            print(f"{k:>10} " + " ".join(f"{name} {v:.0f}" for name, v in row.items()), flush=True)
        return
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    tokens = [int(x) for x in args.tokens.split(",")]
    builder = flash_builder(max(batches), max(contexts))
    if args.profile:
        profile(builder, batches[0], contexts[0], tokens[0], args.repeat)
        return
    print("model side, median us per step (Flash-width slice geometry, CPU)")
    print(f"{'ctx':>6} {'batch':>5} {'n':>2} {'ForwardBatch':>12} {'eager build':>12} {'fixed build':>12} "
          f"{'graph step':>11}")
    for c in contexts:
        for bsz in batches:
            for n in tokens:
                r = measure(builder, bsz, c, n, args.repeat)
                print(f"{c:>6} {bsz:>5} {n:>2} {r['batch']:>12.0f} {r['eager']:>12.0f} {r['fixed']:>12.0f} "
                      f"{r['graph']:>11.0f}", flush=True)
    if args.against:
        old = metadata_at(args.against)
        print(f"\neager build, median us, this tree vs {args.against} (same steps, in turn)")
        for c in contexts:
            for bsz in batches:
                for n in tokens:
                    now, then = eager_against_us(builder.geo, bsz, c, n, args.repeat, old)
                    print(f"{c:>6} {bsz:>5} {n:>2} {now:>8.0f} {then:>8.0f}", flush=True)
    if args.parts:
        print("\nfixed build by part, median us (through timing wrappers)")
        header = None
        for c in contexts:
            for bsz in batches:
                for n in tokens:
                    r = measure_parts(builder, bsz, c, n, args.repeat)
                    if header is None:
                        header = list(r)
                        print(f"{'ctx':>6} {'batch':>5} {'n':>2} " + " ".join(f"{k:>8}" for k in header))
                    print(f"{c:>6} {bsz:>5} {n:>2} " + " ".join(f"{r[k]:>8.0f}" for k in header), flush=True)
    if args.engine_steps:
        print("\nengine side (engine thread CPU time, benchmarks/engine_overhead.py, token ids only, async)")
        print(f"{'batch':>5} {'schedule us':>12} {'process us':>11}")
        for bsz in batches:
            r = engine_measure(bsz, args.engine_steps, sync=False, tokenizer=None)
            print(f"{bsz:>5} {1e3 * r['schedule_ms']:>12.0f} {1e3 * r['postprocess_ms']:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
