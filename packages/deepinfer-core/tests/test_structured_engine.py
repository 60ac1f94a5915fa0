"""Structured output through the engine: random toy logits, the synthetic tokenizer, and masks that force
every output to be valid whatever the weights. Also batch independence, n > 1, preemption, abort,
thinking before the constraint, and the error paths (bad grammars at add_request, dead ends, timeouts)."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest
import torch

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.engine.sequence import SeqStatus
from deepinfer.sampling import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
REGEX = r"(\d{3}-\d{4}|[a-z]{2,6}@[a-z]{2,5}\.(com|org))"
LARK = 'start: NUM (" " OP " " NUM){1,3}\nNUM: /[1-9][0-9]{0,2}/\nOP: "+" | "*"'
PROMPTS = [[0, 5, 6, 7], [0, 40, 41], [0, 99, 100, 101, 102, 103], [0, 7]]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_engine(toy_models, synthetic_tokenizer):
    engines = []

    def make(tokenizer=synthetic_tokenizer, **config) -> LLMEngine:
        config = {"max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                  "cache_bytes": 1 << 20, "log_stats_interval": 0, **config}
        toy = toy_models[0](vocab_size=synthetic_tokenizer.vocab_size)
        engines.append(LLMEngine(toy, tokenizer, EngineConfig(**config)))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


def run(engine: LLMEngine, reqs: dict[str, tuple[list[int], SamplingParams]]) -> dict:
    for rid, (prompt, params) in reqs.items():
        engine.add_request(prompt, params, request_id=rid)
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o for o in engine.step() if o.finished}
    assert engine.cache.all_free()
    return done


def params(seed: int, n: int = 1, **so) -> SamplingParams:
    return SamplingParams(n=n, seed=seed, max_tokens=120, structured_outputs=so)


def assert_valid(rid: str, text: str, choices: tuple[str, ...]) -> None:
    """The output of request `rid` ("<kind>-<i>") satisfies its kind's constraint."""
    kind = rid.split("-")[0]
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "lark":
        assert re.fullmatch(r"[1-9][0-9]{0,2}( [+*] [1-9][0-9]{0,2}){1,3}", text), text
    else:
        assert text in choices, text


def test_every_output_is_valid(make_engine, synthetic_tokenizer):
    kinds = {"json": {"json_schema": SCHEMA}, "regex": {"regex": REGEX}, "lark": {"grammar": LARK},
             "choice": {"choice": ["yes", "no", "not sure"]}}
    reqs = {f"{kind}-{i}": (PROMPTS[i % 4], params(i, **so)) for kind, so in kinds.items() for i in range(6)}
    done = run(make_engine(), reqs)
    for rid, out in done.items():
        c = out.outputs[0]
        assert c.finish_reason == "stop" and c.token_ids[-1] == synthetic_tokenizer.tokenizer.token_to_id(
            "<｜end▁of▁sentence｜>"), (rid, c)
        assert_valid(rid, c.text, ("yes", "no", "not sure"))
    # greedy over random logits would not produce these by itself
    assert len({done[f"json-{i}"].outputs[0].text for i in range(6)}) > 1


def test_json_object_after_thinking_keeps_free_reasoning(make_engine, synthetic_tokenizer):
    think = synthetic_tokenizer.tokenizer.token_to_id("</think>")
    p = SamplingParams(seed=3, max_tokens=150, logit_bias={think: 5.0},
                       structured_outputs={"json_object": True, "start_after": "</think>"})
    done = run(make_engine(), {f"r{i}": ([0, 9 + i, 10], p.model_copy(update={"seed": i}))
                               for i in range(4)})
    free_reasoning = 0
    for out in done.values():
        ids = out.outputs[0].token_ids
        assert think in ids, "the bias makes the reasoning end"
        end = ids.index(think)
        reasoning = synthetic_tokenizer.decode(ids[:end])
        free_reasoning += not reasoning.lstrip().startswith("{")
        answer = synthetic_tokenizer.decode(ids[end + 1:])
        if out.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(answer), dict), answer
        else:  # the length limit cut the object: still a valid prefix of one
            assert answer.startswith("{"), answer
    assert free_reasoning >= 3, "the mask must be off before the trigger"


def test_batch_independent_n_and_preemption(make_engine):
    alone = run(make_engine(), {"a": (PROMPTS[2], params(11, json_schema=SCHEMA))})["a"].outputs[0].token_ids
    mixed = {"a": (PROMPTS[2], params(11, json_schema=SCHEMA)),
             "free": (PROMPTS[0], SamplingParams(seed=1, max_tokens=40, ignore_eos=True)),
             "n": (PROMPTS[1], params(5, n=3, regex=REGEX)),
             "b": (PROMPTS[3], params(2, choice=["alpha", "beta"]))}
    done = run(make_engine(), mixed)
    assert done["a"].outputs[0].token_ids == alone
    assert len(done["n"].outputs) == 3
    assert all(re.fullmatch(REGEX, c.text) for c in done["n"].outputs)
    # a cache too small for all of them at once: preemption by recompute replays known tokens only
    # synchronous steps: with async scheduling whether a step finds the blocks freed depends on timing
    engine = make_engine(max_num_seqs=4, cache_bytes=12 * 32 + 9 * 64 + 32, async_scheduling=False)
    squeezed = run(engine, mixed)
    assert engine.scheduler.num_preemptions > 0
    for rid, out in done.items():
        assert [c.token_ids for c in squeezed[rid].outputs] == [c.token_ids for c in out.outputs], rid


def test_abort_drops_the_grammar_state(make_engine):
    engine = make_engine()
    engine.add_request(PROMPTS[0], params(1, json_schema=SCHEMA), request_id="x")
    engine.add_request(PROMPTS[1], params(2, regex=REGEX), request_id="y")
    for _ in range(200):  # until both are decoding (admission waits for their grammars)
        engine.step()
        if len(engine.runner.structured._states) == 2:
            break
    assert len(engine.runner.structured._states) == 2
    engine.abort("x")
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o for o in engine.step() if o.finished}
    assert done["x"].outputs[0].finish_reason == "abort"
    assert re.fullmatch(REGEX, done["y"].outputs[0].text)
    engine.add_request(PROMPTS[2], SamplingParams(max_tokens=2), request_id="z")
    run(engine, {})
    assert engine.runner.structured._states == {}


@pytest.mark.parametrize("so, message", [
    ({"regex": "a+("}, "invalid regex"),
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}, "invalid json_schema"),
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"grammar": "start: missing_rule"}, "invalid grammar"),
    ({"regex": "a", "choice": ["b"]}, "exactly one of"),
    ({}, "exactly one of"),
    ({"choice": []}, "choice"),
    ({"tools": {"tools": [{"name": "bad name!"}]}}, "name"),
])
def test_bad_constraints_are_rejected_at_add_request(make_engine, so, message):
    engine = make_engine()
    with pytest.raises(ValueError, match=message):
        engine.add_request(PROMPTS[0], {"structured_outputs": so})
    with pytest.raises(ValueError, match="min_tokens"):  # EOS banned where the grammar is complete
        engine.add_request(PROMPTS[0], {"structured_outputs": {"regex": "a"}, "min_tokens": 2})
    assert not engine.has_unfinished_requests()


def test_no_tokenizer_is_a_clear_error(make_engine):
    engine = make_engine(tokenizer=None)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        engine.add_request(PROMPTS[0], params(0, regex="a+"))


class _DeadEnd:
    """A backend whose grammar allows nothing after `after` tokens, or never finishes compiling."""

    def __init__(self, real, after: int, hang: threading.Event | None = None):
        self.real, self.after, self.hang = real, after, hang
        self.vocab_size, self.encode = real.vocab_size, real.encode

    def compile(self, spec):
        if self.hang is not None:
            self.hang.wait(5)
        return self.real.compile(spec)

    def fill(self, rows, bitmask):
        self.real.fill(rows, bitmask)
        for m, i in rows:
            if len(m.history) >= self.after:
                bitmask[i] = 0


def _with_backend(engine: LLMEngine, wrap) -> None:
    from deepinfer.structured.llguidance_backend import LLGuidanceBackend

    class Counting:  # records the tokens a matcher accepted, to dead-end after some
        def __init__(self, m):
            self.m, self.history = m, []

        def accept(self, t):
            self.history.append(t)
            return self.m.accept(t)

        def fork(self):
            return Counting(self.m.fork())

        def rollback(self, n):
            self.m.rollback(n)

        def error(self):
            return self.m.error()

    class Backend(LLGuidanceBackend):
        def compile(self, spec):
            return Counting(super().compile(spec))

        def fill(self, rows, bitmask):
            super().fill([(m.m, i) for m, i in rows], bitmask)

    manager = engine.runner.structured
    manager._factory = lambda tok, v, eos: wrap(Backend(tok, v, eos))


def test_dead_end_and_timeout_finish_with_grammar_error(make_engine):
    engine = make_engine()
    _with_backend(engine, lambda real: _DeadEnd(real, after=3))
    done = run(engine, {"d": (PROMPTS[0], params(1, regex="[a-z]{20}"))})
    c = done["d"].outputs[0]
    assert c.finish_reason == "grammar_error" and len(c.token_ids) == 4, c

    # a slow compile holds its request out of the batch; the others run
    engine = make_engine()
    hang = threading.Event()
    _with_backend(engine, lambda real: _DeadEnd(real, after=10**9, hang=hang))
    engine.add_request(PROMPTS[1], SamplingParams(max_tokens=5, seed=0), request_id="free")
    engine.add_request(PROMPTS[0], params(1, regex="[a-z]{3}"), request_id="slow")
    done = {}
    while "free" not in done:
        done |= {o.request_id: o for o in engine.step() if o.finished}
    assert engine.requests["slow"].seqs[0].status is SeqStatus.WAITING
    hang.set()
    done |= run(engine, {})
    assert re.fullmatch("[a-z]{3}", done["slow"].outputs[0].text)

    engine = make_engine()
    hang = threading.Event()
    _with_backend(engine, lambda real: _DeadEnd(real, after=10**9, hang=hang))
    engine.runner.structured.timeout = 0.05
    done = run(engine, {"t": (PROMPTS[0], params(1, regex="[a-z]+")),
                        "free": (PROMPTS[1], SamplingParams(max_tokens=5, seed=0))})
    hang.set()
    assert done["t"].outputs[0].finish_reason == "grammar_error"
    assert len(done["t"].outputs[0].token_ids) == 1  # the first row already ended it
    assert done["free"].outputs[0].finish_reason == "length"


@pytest.mark.slow
def test_real_runtime_outputs_validate(tiny_checkpoint):
    """The same guarantee on the DeepSeek-V4.1 runtime (tiny random checkpoint, reference backend)."""
    from deepinfer.engine.loader import TextTokenizer, load_model

    model = load_model(tiny_checkpoint)
    config = EngineConfig(max_model_len=256, max_num_seqs=4, cache_bytes=16 << 20, log_stats_interval=0)
    with LLMEngine(model, TextTokenizer.from_dir(tiny_checkpoint), config) as engine:
        reqs = {"json": (PROMPTS[0], params(0, json_schema=SCHEMA)),
                "regex": (PROMPTS[1], params(1, regex=REGEX)),
                "greedy": (PROMPTS[2], SamplingParams(temperature=0, max_tokens=120,
                                                      structured_outputs={"choice": ["alpha", "beta"]}))}
        done = run(engine, reqs)
    jsonschema.validate(json.loads(done["json"].outputs[0].text), SCHEMA)
    assert re.fullmatch(REGEX, done["regex"].outputs[0].text)
    assert done["greedy"].outputs[0].text in ("alpha", "beta")


def test_xgrammar_backend_plugs_in(make_engine, monkeypatch):
    """The other library behind the same seam (runs where xgrammar is installed; it is no dependency):
    DEEPINFER_STRUCTURED_BACKEND=xgrammar routes JSON/regex/choice to it, grammars to llguidance."""
    xgrammar_backend = pytest.importorskip("deepinfer.structured.xgrammar_backend")
    monkeypatch.setenv("DEEPINFER_STRUCTURED_BACKEND", "xgrammar")
    engine = make_engine()
    kinds = {"json": {"json_schema": SCHEMA}, "regex": {"regex": REGEX}, "lark": {"grammar": LARK},
             "choice": {"choice": ["yes", "no"]}}
    done = run(engine, {f"{kind}-{i}": (PROMPTS[i], params(i, **so)) for kind, so in kinds.items()
                        for i in range(3)})
    backend = engine.runner.structured.backend
    assert isinstance(backend, xgrammar_backend.RoutedBackend)
    for rid, out in done.items():
        c = out.outputs[0]
        assert c.finish_reason == "stop", (rid, c)
        assert_valid(rid, c.text, ("yes", "no"))
    bad = params(0, regex="a").structured_outputs.model_copy(update={"regex": "a+("})  # skips the check
    with pytest.raises(ValueError, match="invalid regex"):
        backend.compile(bad)
    ebnf = xgrammar_backend.XGrammarBackend(engine.tokenizer, engine.vocab_size, 1)
    m = ebnf.compile(params(0, grammar='root ::= "a" [0-9]').structured_outputs)
    assert m.accept(engine.tokenizer.encode("a")[-1]) and not m.fork().accept(5)
