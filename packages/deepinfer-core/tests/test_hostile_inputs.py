"""Hostile-input harness: what a careless or hostile user can throw at the `LLM`/engine API, the model
config and checkpoint loading, the recipe's Python boundary and the CLI.

For every input the answer must be a clear error (ValueError/TypeError, or one line and exit code 2/1
on the CLI) or a correct result; never a traceback, a crash or a hang (a watchdog kills a hung test).
After each input the engine must serve a reference request with identical output, with every cache
block and state slot back. Interrupts (SIGINT delivered mid-step), abandoned iterators, concurrent
aborts, failing steps and nesting/size bombs are included. The number of inputs tried is printed at
the end of the module.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer.config import ConfigError, ModelConfig, load_model_config
from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.entrypoints.cli.main import main
from deepinfer.entrypoints.llm import LLM
from deepinfer.sampling import SamplingParams
from deepinfer.testing import tiny_config

TRIED: Counter[str] = Counter()
DELIVERED_MID_CALL = [0]  # interrupts that landed inside the call (the rest landed after it)
VOCAB = 320  # ToyLM's
REFERENCE = ([[5, 6, 7, 8]], SamplingParams(temperature=0.7, seed=11, max_tokens=12, ignore_eos=True))
# one engine per test serves every example: that it keeps serving identically is the point
SHARED = settings(deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def report_size(request):
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None and TRIED:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nhostile-input harness: {sum(TRIED.values())} inputs tried "
                                f"({', '.join(f'{k} {v}' for k, v in sorted(TRIED.items()))}; "
                                f"{DELIVERED_MID_CALL[0]} interrupts landed mid-call)")


@pytest.fixture(autouse=True)
def watchdog():
    """No hang: a test still running after 120 s dumps every thread's stack and ends the process."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _toy_llm(model, tokenizer=None, **config) -> LLM:
    config = {"max_model_len": 96, "max_num_seqs": 8, "max_num_batched_tokens": 32, "cache_bytes": 1 << 20,
              "log_stats_interval": 0, **config}
    return LLM.from_engine(LLMEngine(model, tokenizer, EngineConfig(**config)))


class Harness:
    """An LLM plus the reference output it must keep giving."""

    def __init__(self, llm: LLM):
        self.llm = llm
        self.reference = self._reference()

    def _reference(self) -> list[int]:
        return self.llm.generate(prompt_token_ids=REFERENCE[0], sampling_params=REFERENCE[1],
                                 use_tqdm=False)[0].outputs[0].token_ids

    def assert_healthy(self) -> None:
        engine = self.llm.engine
        assert not engine.has_unfinished_requests(), f"left behind: {sorted(engine.requests)}"
        assert not engine.scheduler.has_work()
        assert engine.cache.all_free(), "cache blocks or state slots not returned"
        assert self._reference() == self.reference, "the engine serves a different output now"
        assert engine.cache.all_free()


@pytest.fixture(params=[True, False], ids=["async", "sync"])
def harness(request, toy_models, synthetic_tokenizer):
    llm = _toy_llm(toy_models[0](), synthetic_tokenizer, async_scheduling=request.param)
    yield Harness(llm)
    llm.close()


# ---- the LLM API: prompts, sampling params, request ids ---------------------------------------------

GOOD_PROMPTS = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=24),
)
BAD_PROMPTS = st.sampled_from([
    [], "", [1.5], [2.0], [True], [-1], [VOCAB], [2**63], [[1, 2]], [None], ["3"], None, 5, 1.0,
    {"a": 1}, b"bytes", "\udcff broken", "ok \ud800", [float("nan")], list(range(400)),
])
ODD_VALUES = st.sampled_from([None, -1, 0, 1, 2, 1.5, 2.0, True, "2", float("nan"), float("inf"), -1e308,
                              2**64, [], {}, "x" * 5, [1, 2]])
PARAMS = st.one_of(
    st.none(),
    st.builds(SamplingParams, max_tokens=st.integers(1, 10), temperature=st.floats(0, 2),
              top_k=st.sampled_from([-1, 0, 1, 5]), n=st.integers(1, 3), seed=st.integers(0, 2**64 - 1),
              ignore_eos=st.booleans(), logprobs=st.none() | st.integers(0, 3)),
    st.dictionaries(st.sampled_from(["max_tokens", "min_tokens", "temperature", "top_k", "top_p", "min_p",
                                     "n", "seed", "stop", "stop_token_ids", "logprobs", "logit_bias",
                                     "presence_penalty", "repetition_penalty", "bogus"]),
                    ODD_VALUES, max_size=4).map(lambda d: {"max_tokens": 6, **d}),
)


@settings(SHARED, max_examples=60)
@given(prompts=st.lists(st.one_of(GOOD_PROMPTS, BAD_PROMPTS), min_size=1, max_size=4),
       params=PARAMS, stream=st.booleans())
def test_llm_batches(harness, prompts, params, stream):
    TRIED["llm batch"] += 1
    llm = harness.llm
    try:
        if stream:
            outs = [o for o in llm.generate_stream(prompts, params) if o.finished]
        else:
            outs = llm.generate(prompts, params, use_tqdm=False)
    except (ValueError, TypeError) as exc:
        assert str(exc)  # a message, naming what is wrong
    else:
        assert len(outs) == len(prompts)
        for out in outs:
            assert out.finished and all(c.finish_reason in ("stop", "length", "prompt_length_exceeded")
                                        for c in out.outputs)
    harness.assert_healthy()


@settings(SHARED, max_examples=25)
@given(ids=st.lists(st.one_of(st.sampled_from(["req-0", "req-1", "req-7", "", "x"]), st.text(max_size=6),
                              st.integers(0, 3)), max_size=5))
def test_caller_request_ids_never_collide_with_generated(harness, ids):
    TRIED["request ids"] += 1
    engine = harness.llm.engine
    given_ids = []
    for rid in ids:
        try:
            given_ids.append(engine.add_request([3, 4], {"max_tokens": 2}, request_id=rid))
        except (ValueError, TypeError):
            assert not isinstance(rid, str) or rid in given_ids
    auto = [engine.add_request([3, 4], {"max_tokens": 2}) for _ in range(3)]
    assert not set(auto) & set(given_ids)
    harness.llm.engine.abort([*given_ids, *auto], report=False)
    harness.assert_healthy()


# ---- interrupts, abandoned iterators, concurrent aborts, failing steps ------------------------------


@pytest.fixture(params=[True, False], ids=["async", "sync"])
def slow_harness(request, toy_models):
    class SlowToy(toy_models[0]):
        def forward(self, batch):
            time.sleep(0.002)  # long enough that a signal usually lands while a step runs
            return super().forward(batch)

    llm = _toy_llm(SlowToy(), async_scheduling=request.param)
    yield Harness(llm)
    llm.close()


@settings(SHARED, max_examples=25)
@given(delay=st.floats(0.0, 0.06), stream=st.booleans())
def test_interrupt_mid_step(slow_harness, delay, stream):
    """SIGINT at a random moment of generate: it raises KeyboardInterrupt or completes, and the engine
    is consistent either way (the in-flight step is waited for, the call's requests are aborted)."""
    TRIED["interrupt"] += 1
    llm = slow_harness.llm
    params = SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.5, seed=1)
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
    timer = threading.Timer(delay, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    try:
        timer.start()
        if stream:
            list(llm.generate_stream(prompt_token_ids=prompts, sampling_params=params))
        else:
            llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        timer.join()  # a signal after the call lands here
        time.sleep(0.001)
    except KeyboardInterrupt:
        DELIVERED_MID_CALL[0] += 1
        timer.join()
    slow_harness.assert_healthy()


@settings(SHARED, max_examples=30)
@given(taken=st.integers(0, 6), how=st.sampled_from(["close", "drop", "raise", "interleave"]))
def test_abandoned_streams(harness, taken, how):
    TRIED["abandoned stream"] += 1
    llm = harness.llm
    params = SamplingParams(max_tokens=10, ignore_eos=True, temperature=0)
    stream = llm.generate_stream(prompt_token_ids=[[3, 4, 5], [7, 8]], sampling_params=params)
    got = []
    try:
        for out in stream:
            got.append(out)
            if len(got) > taken:
                if how == "raise":
                    raise LookupError("the consumer failed")
                break
    except LookupError:
        pass
    if how == "close":
        stream.close()
    elif how == "interleave":  # another call steps the engine while this stream is paused
        other = llm.generate(prompt_token_ids=[[9, 9, 9]], sampling_params=params, use_tqdm=False)
        assert other[0].outputs[0].finish_reason == "length"
        rest = [o for o in stream]  # the paused stream still gets all of its outputs
        tokens = {}
        for o in got + rest:
            tokens.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
        assert all(len(t) == 10 for t in tokens.values()) and len(tokens) == 2
    del stream
    harness.assert_healthy()


@settings(SHARED, max_examples=15)
@given(victims=st.lists(st.integers(0, 5), max_size=6), delay=st.floats(0, 0.02))
def test_concurrent_aborts(slow_harness, victims, delay):
    """Another thread aborts requests (some twice, some unknown) while generate runs."""
    TRIED["concurrent abort"] += 1
    llm = slow_harness.llm
    engine = llm.engine
    params = SamplingParams(max_tokens=15, ignore_eos=True, temperature=0)

    def aborter():
        time.sleep(delay)
        for v in victims:
            ids = sorted(engine.requests)
            engine.abort(ids[v] if v < len(ids) else f"unknown-{v}")

    thread = threading.Thread(target=aborter)
    thread.start()
    outs = llm.generate(prompt_token_ids=[[3, 4], [5, 6], [7, 8]], sampling_params=params, use_tqdm=False)
    thread.join()
    assert all(o.outputs[0].finish_reason in ("length", "abort") for o in outs)
    slow_harness.assert_healthy()


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("fail_at", [1, 2, 5])
def test_failed_step_ends_its_requests_with_error(toy_models, async_scheduling, fail_at):
    TRIED["failing step"] += 1

    class FailingToy(toy_models[0]):
        calls = 0

        def forward(self, batch):
            FailingToy.calls += 1
            if FailingToy.calls == fail_at:
                raise RuntimeError("device lost")
            return super().forward(batch)

    llm = _toy_llm(FailingToy(), async_scheduling=async_scheduling)
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(prompt_token_ids=[[3, 4], [5, 6, 7]], sampling_params=params, use_tqdm=False)
    engine = llm.engine
    engine.add_request([9, 9], params, request_id="bystander")  # queued after the failure: unaffected
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert outs[-1].request_id == "bystander" and outs[-1].outputs[0].finish_reason == "length"
    assert engine.cache.all_free()
    fresh = _toy_llm(toy_models[0](), async_scheduling=async_scheduling)
    want = fresh.generate(prompt_token_ids=[[3, 4]], sampling_params=params, use_tqdm=False)
    got = llm.generate(prompt_token_ids=[[3, 4]], sampling_params=params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    llm.close()
    fresh.close()


def test_error_outputs_reach_engine_users(toy_models):
    """Users of the bare engine see the failed step's requests end with "error" at the next step."""
    TRIED["failing step"] += 1

    class FailOnce(toy_models[0]):
        failed = False

        def forward(self, batch):
            if not FailOnce.failed:
                FailOnce.failed = True
                raise RuntimeError("boom")
            return super().forward(batch)

    engine = LLMEngine(FailOnce(), None, EngineConfig(max_model_len=64, cache_bytes=1 << 20,
                                                      log_stats_interval=0))
    engine.add_request([3, 4], {"max_tokens": 4, "n": 2}, request_id="a")
    with pytest.raises(RuntimeError, match="boom"):
        while engine.has_unfinished_requests():
            engine.step()
    outs = engine.step()
    assert [(o.request_id, {c.finish_reason for c in o.outputs}) for o in outs] == [("a", {"error"})]
    assert engine.cache.all_free() and not engine.has_unfinished_requests()
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.step()


# ---- model config and checkpoint loading ------------------------------------------------------------

HOSTILE_JSON = st.one_of(
    st.sampled_from([None, True, -1, 0, 2**31, 2**62, 10**30, -(10**30), 0.5, float("inf"), float("nan"),
                     -0.0, "", "silu", [], {}, [0] * 3, [[[[]]]]]),
    st.integers(), st.floats(), st.text(max_size=5),
)


@settings(SHARED, max_examples=200)
@given(key=st.sampled_from(sorted(tiny_config("full").to_hf_dict()["text_config"])), value=HOSTILE_JSON)
def test_config_values(key, value):
    """Any value under any text_config key: a ConfigError naming the key, or a valid config."""
    TRIED["config value"] += 1
    data = tiny_config("full").to_hf_dict()
    data["text_config"][key] = value
    started = time.monotonic()
    try:
        cfg = ModelConfig.from_hf_dict(data)
    except ConfigError as exc:
        assert key in str(exc) or "text_config" in str(exc)
    else:
        floats = [v for v in cfg.text.model_dump().values() if isinstance(v, float)]
        assert all(math.isfinite(v) for v in floats)
    assert time.monotonic() - started < 5, "validation must not blow up on large values"


@pytest.mark.parametrize("key", ["engram_n_heads", "engram_max_ngram_size", "engram_vocab_size"])
def test_engram_sizes_that_would_stall_the_prime_search(key):
    """Validation searches one hash prime per (layer, order, head) above the Engram vocabulary: a huge
    count or vocabulary is refused by name at once instead of searching (2**31 heads never finished)."""
    data = tiny_config("full").to_hf_dict()
    data["text_config"][key] = 2**31 if key != "engram_vocab_size" else 10**30
    started = time.monotonic()
    with pytest.raises(ConfigError, match=key):
        ModelConfig.from_hf_dict(data)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("content", [
    b"\xff\xfe{}", b"", b"[" * 100_000 + b"]" * 100_000, b'{"architectures": NaN}', b"null", b"[1, 2]",
    b'{"architectures": ["DeepseekV41ForCausalLM"], "text_config": 1e400}',
], ids=["not-utf8", "empty", "nesting-bomb", "nan", "null", "list", "overflow"])
def test_config_files(tmp_path, content):
    TRIED["config file"] += 1
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ConfigError):
        load_model_config(tmp_path)


def test_config_paths(tmp_path):
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "config.json").symlink_to(loop / "config.json")
    (tmp_path / "isdir" / "config.json").mkdir(parents=True)
    for path in (loop, tmp_path / "isdir", tmp_path / "missing"):
        TRIED["config file"] += 1
        with pytest.raises(ConfigError, match=r"config\.json"):
            load_model_config(path)


def _broken_checkpoint(src: str, dst: Path, how: str) -> Path:
    dst.mkdir()
    for f in Path(src).iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    shard = next(dst.glob("*.safetensors"))
    if how == "truncated-shard":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif how == "garbage-header":
        shard.write_bytes(b"\xff" * 64)
    elif how == "vocab-mismatch":
        cfg = json.loads((dst / "config.json").read_text())
        cfg["text_config"]["vocab_size"] *= 1000
        (dst / "config.json").write_text(json.dumps(cfg))
    elif how == "bad-tokenizer":
        (dst / "tokenizer.json").write_text("{not json")
    elif how == "non-finite-config":
        cfg = json.loads((dst / "config.json").read_text())
        cfg["text_config"]["rms_norm_eps"] = float("inf")  # written as Infinity, which json reads back
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("how", ["truncated-shard", "garbage-header", "vocab-mismatch", "bad-tokenizer",
                                 "non-finite-config"])
def test_broken_checkpoints(tiny_checkpoint, tmp_path, how):
    TRIED["checkpoint"] += 1
    path = _broken_checkpoint(tiny_checkpoint, tmp_path / how, how)
    with pytest.raises((ValueError, OSError)) as info:
        LLM(path, max_model_len=64, cache_bytes=4 << 20)
    assert str(info.value)


# ---- the recipe's Python boundary (called, not fixed here) -------------------------------------------

RECIPE_PROBES = """
import sys, deepseek_recipe as r
def nested(depth):
    x = []
    c = x
    for _ in range(depth):
        n = []; c.append(n); c = n
    return x
cyclic = {"role": "user", "content": "hi"}
cyclic["self"] = cyclic
bodies = [
    {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": nested(200_000)}]},
    {"model": "DeepSeek-V4.1-Flash", "messages": [cyclic]},
    {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "x" * 5_000_000}]},
    {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "\\udcff"}]},
    {"model": "DeepSeek-V4.1-Flash", "messages": {"role": "user"}},
    "[" * 200_000,
]
for body in bodies:
    try:
        r.ChatCompletionRequest(body).convert(r.ConversionOptions())
        print("accepted")
    except Exception as exc:
        print("raised", type(exc).__name__)
"""


def test_recipe_python_boundary():
    """Deep nesting, cycles, huge and undecodable strings into deepseek_recipe's request object: in a
    child process, since a crash there would take the test runner with it."""
    pytest.importorskip("deepseek_recipe")
    TRIED["recipe"] += 6
    proc = subprocess.run([sys.executable, "-c", RECIPE_PROBES], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"recipe crashed (rc {proc.returncode}): {proc.stderr[-500:]}"
    lines = proc.stdout.split()
    assert len(proc.stdout.splitlines()) == 6
    assert "accepted" not in lines[:2] and proc.stdout.splitlines()[3].startswith("raised")


@pytest.fixture(scope="module")
def real_llm(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, max_model_len=64, max_num_seqs=4, cache_bytes=8 << 20, log_stats_interval=0)
    yield Harness(llm)
    llm.close()


def _nested(depth: int) -> list:
    x: list = []
    cur = x
    for _ in range(depth):
        cur.append([])
        cur = cur[0]
    return x


def _cyclic() -> dict:
    msg: dict = {"role": "user", "content": "hi"}
    msg["again"] = msg
    return msg


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": _nested(100_000)}],
    [_cyclic()],
    [{"role": "user", "content": "broken \udcff"}],
    [{"role": "user", "content": float("nan")}],
    [{"role": "user", "content": {1, 2}}],
    [{"role": "bogus", "content": "hi"}],
    [{"role": "user", "content": "word " * 200}],  # longer than max_model_len
], ids=["nesting-bomb", "cycle", "not-utf8", "nan", "set", "bad-role", "over-long"])
def test_chat_boundary(real_llm, messages):
    pytest.importorskip("deepseek_recipe")
    TRIED["chat"] += 1
    params = SamplingParams(max_tokens=4, temperature=0)
    try:
        reply = real_llm.llm.chat(messages, params, use_tqdm=False)[0]
    except ValueError as exc:
        assert str(exc)
    else:  # only the over-long prompt gets here: the engine's reason, not an empty "stop"
        assert reply.finish_reason == "prompt_length_exceeded" and reply.content is None
    deltas = []
    with contextlib.suppress(ValueError):
        deltas = list(real_llm.llm.chat_stream(messages, params))
    assert deltas in ([], [{"finish_reason": "prompt_length_exceeded"}])
    real_llm.assert_healthy()


# ---- the CLI -----------------------------------------------------------------------------------------

CLI_CASES = [  # (argv after the checkpoint, exit code, text expected in the one stderr line)
    (["generate", "--prompt-ids", "1,2", "--top-k", "-7"], 2, "--top-k"),
    (["generate", "--prompt-ids", "1,2", "--temperature", "nan"], 2, "--temperature"),
    (["generate", "--prompt-ids", "1,2", "--max-model-len", "10000000"], 2, "max_position_embeddings"),
    (["generate", "--prompt-ids", "1,2", "--cache-mb", "0"], 2, "--cache-mb"),
    (["generate", "--prompt-ids", "1,2", "--max-num-seqs", "4", "--max-num-batched-tokens", "2"], 2,
     "max_num_batched_tokens"),
    (["generate", "--prompt-ids", "1,2", "--replay-keep", "200"], 2, "--replay-keep"),
    (["generate", "--prompt-ids", "1,2", "--replay-mode", "mask", "--replay-keep", "3"], 1, "keep=3"),
    (["generate", "--prompt-ids", "1,2", "--gpu-memory-utilization", "inf"], 2, "finite"),
    (["generate", "--prompt", "bad \udcff", "--max-tokens", "2"], 1, "UTF-8"),
    (["generate", "--prompt-ids", "1,99999999"], 1, "vocab_size"),
    (["generate"], 2, "--prompt"),
    (["score", "--input", "{missing}", "--out", "{tmp}/o.safetensors"], 1, "No such file"),
    (["score", "--input", "{bad_json}", "--out", "{tmp}/o.safetensors"], 1, "prompt"),
    (["bench", "--overhead-batches", "1,-3"], 2, "--overhead-batches"),
]


CLI_IDS = [f"{case[0][0]}-{i}" for i, case in enumerate(CLI_CASES)]


def _fill(argv: list[str], tmp_path: Path) -> list[str]:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([[1, 2.5]]))
    return [a.replace("{missing}", str(tmp_path / "missing.json")).replace("{tmp}", str(tmp_path))
            .replace("{bad_json}", str(bad)) for a in argv]


@pytest.mark.parametrize("argv,code,needle", CLI_CASES, ids=CLI_IDS)
def test_cli_errors_in_process(tiny_checkpoint, tmp_path, capsys, argv, code, needle):
    """The CLI answers each mistake with one line and the right exit code (in process: fast)."""
    TRIED["cli"] += 1
    argv = _fill(argv, tmp_path)
    try:
        got = main([argv[0], "--model", tiny_checkpoint, "--log-level", "ERROR", *argv[1:]])
    except SystemExit as exit_:  # argparse's own usage errors
        got = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
    assert got == code, err
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def _cli(*argv: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepinfer.entrypoints.cli.main", *argv], input=stdin,
                          capture_output=True, timeout=120, env={**os.environ, **(env or {})})


def test_cli_subprocess_bytes_and_debug(tiny_checkpoint):
    """Real argv/stdin bytes that are not UTF-8, and --debug: the few cases that need a real process."""
    pytest.importorskip("deepseek_recipe")
    TRIED["cli"] += 3
    model = ["--model", tiny_checkpoint, "--max-tokens", "2", "--temperature", "0", "--log-level", "ERROR"]
    proc = _cli("chat", *model, stdin=b"hello\n\xff\xfe oops\nagain\n")
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.count(b"assistant> ") == 2 and b"not valid UTF-8" in proc.stderr
    proc = _cli("generate", *model, "--prompt-ids", "1,2", "--top-k", "-9", env={"DEEPINFER_DEBUG": "1"})
    assert proc.returncode == 1 and b"Traceback" in proc.stderr  # the traceback, as asked
    proc = _cli("generate", os.fsdecode(b"--prompt=\xff\xfe"), *model)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert proc.stderr.strip().count(b"\n") == 0 and b"UTF-8" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("argv,code,needle", CLI_CASES, ids=CLI_IDS)
def test_cli_errors_as_subprocesses(tiny_checkpoint, tmp_path, argv, code, needle):
    """The same table through real processes (slow: ~2 s per start)."""
    TRIED["cli (subprocess)"] += 1
    argv = _fill(argv, tmp_path)
    proc = _cli(argv[0], "--model", tiny_checkpoint, *argv[1:], "--log-level", "ERROR")
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == code and "Traceback" not in err, err
    assert needle in err.splitlines()[-1]


@pytest.mark.slow
def test_cli_ctrl_c_mid_generation(tiny_checkpoint):
    """SIGINT while tokens stream: exit 130 with one line, no traceback."""
    TRIED["cli (subprocess)"] += 1
    argv = ["generate", "--model", tiny_checkpoint, "--prompt-ids", "1,2,3", "--max-tokens", "3000",
            "--max-model-len", "4000", "--ignore-eos", "--stream", "--log-level", "ERROR"]
    proc = subprocess.Popen([sys.executable, "-m", "deepinfer.entrypoints.cli.main", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.read(1)  # generation has started
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and b"Traceback" not in err and err.strip().endswith(b"interrupted"), err
