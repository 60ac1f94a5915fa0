"""The offline `LLM` API and the generate/chat/bench CLI on the real tiny DeepSeek-V4.1 checkpoint."""

from __future__ import annotations

import json
import re
import sys

import pytest

from deepinfer.entrypoints.cli.main import build_parser, main
from deepinfer.entrypoints.llm import LLM, SettingError
from deepinfer.models.deepseek_v41.runtime import RuntimeOptions
from deepinfer.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, max_model_len=256, max_num_seqs=8, cache_bytes=16 << 20, log_stats_interval=0)
    yield llm
    llm.close()


def test_generate_in_submission_order(llm):
    prompts = ["The quick brown fox", "Hello", "A small model reads the text and writes an answer."]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    for p, o in zip(prompts, outs):
        assert o.prompt_token_ids == llm.tokenizer.encode(p)
        c = o.outputs[0]
        assert len(c.token_ids) == 6 and c.finish_reason == "length"
        assert c.text == llm.tokenizer.decode(c.token_ids)
        assert o.metrics.ttft > 0 and o.metrics.tpot > 0
    ids = llm.generate(prompt_token_ids=[o.prompt_token_ids for o in outs[::-1]], sampling_params=[
        GREEDY, GREEDY, {"temperature": 0, "max_tokens": 3}], use_tqdm=True)
    assert [o.outputs[0].token_ids for o in ids[:2]] == [o.outputs[0].token_ids for o in outs[::-1][:2]]
    assert ids[2].outputs[0].token_ids == outs[0].outputs[0].token_ids[:3]


def test_malformed_batch_raises_before_work(llm):
    with pytest.raises(ValueError):
        llm.generate(["a", "b"], [GREEDY, {"top_p": 7}], use_tqdm=False)
    with pytest.raises(ValueError):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_stream_matches_generate(llm):
    final = llm.generate("Good morning!", GREEDY, use_tqdm=False)[0].outputs[0]
    pieces = list(llm.generate_stream("Good morning!", GREEDY))
    assert pieces[-1].finished
    assert [t for p in pieces for t in p.outputs[0].token_ids] == final.token_ids
    assert "".join(p.outputs[0].text for p in pieces) == final.text


def test_chat_renders_and_parses(llm):
    pytest.importorskip("deepseek_recipe")
    convs = [[{"role": "user", "content": "Hi"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]]
    replies = llm.chat(convs, GREEDY, use_tqdm=False)
    assert len(replies) == 2 and all(r.finish_reason == "length" for r in replies)
    assert replies[0].output.prompt_token_ids[0] == 0  # rendered with BOS by deepseek_recipe
    thought = llm.chat(convs[0], GREEDY, thinking=True, use_tqdm=False)[0]
    assert thought.content == "" and thought.reasoning_content  # never closed </think>: all reasoning
    deltas = list(llm.chat_stream(convs[0], GREEDY, thinking=True))
    assert "".join(d.get("reasoning_content", "") for d in deltas) == thought.reasoning_content
    assert deltas[-1]["finish_reason"] == "length"


def test_chat_without_recipe_names_the_extra(llm, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepseek_recipe", None)
    with pytest.raises(ImportError, match=r"deepinfer-core\[serve\]"):
        llm.chat([{"role": "user", "content": "Hi"}])


def test_cli_generate_json(tiny_checkpoint, llm, capsys):
    argv = ["--log-level", "WARNING", "generate", "--model", tiny_checkpoint, "--max-model-len", "128",
            "--prompt-ids", "0,5,17,33", "--prompt-ids", "0, 9", "--temperature", "0", "--max-tokens", "4",
            "--ignore-eos", "--logprobs", "2", "--json"]
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt_token_ids"] for r in lines] == [[0, 5, 17, 33], [0, 9]]
    want = llm.generate(prompt_token_ids=[[0, 5, 17, 33]], sampling_params=GREEDY, use_tqdm=False)
    out = lines[0]["outputs"][0]
    assert out["token_ids"] == want[0].outputs[0].token_ids[:4] and out["finish_reason"] == "length"
    assert len(out["logprobs"]) == 4 and len(out["logprobs"][0]["top"]) == 2
    assert main(["generate", "--model", tiny_checkpoint]) == 2  # no prompt given


def test_cli_bench_writes_json(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--log-level", "WARNING", "bench", "--model", tiny_checkpoint, "--num-requests", "4",
            "--input-len", "8", "--output-len", "4", "--overhead-batches", "1,4", "--overhead-steps", "2",
            "--max-num-seqs", "4", "--cache-mb", "16", "--json-out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    (t,) = result["throughput"]  # one workload
    assert t["requests"] == 4 and t["output_tokens"] > 0 and t["ttft_s"]["p50"] > 0
    assert [o["running"] for o in result["overhead"]] == [1, 4]
    assert all(o["measured_steps"] == 2 for o in result["overhead"])
    assert t["step_gpu_s"] is None  # GPU time is measured with CUDA events only
    assert "out tok/s" in capsys.readouterr().out


def test_cli_generate_stream_and_chat(tiny_checkpoint, monkeypatch, capsys):
    base = ["--log-level", "WARNING"]
    engine = ["--model", tiny_checkpoint, "--max-model-len", "256", "--cache-mb", "16", "--temperature", "0"]
    assert main([*base, "generate", *engine, "--prompt", "Hello", "--max-tokens", "5", "--stream"]) == 0
    streamed = capsys.readouterr().out
    assert main([*base, "generate", *engine, "--prompt", "Hello", "--max-tokens", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"][0]["text"] + "\n" == streamed
    pytest.importorskip("deepseek_recipe")
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi there\n/reset\nAgain\n/quit\nnever read\n"))
    assert main([*base, "chat", *engine, "--max-tokens", "4", "--thinking"]) == 0
    assert capsys.readouterr().out.count("assistant> ") == 2


def test_runtime_options_reach_the_runtime(tiny_checkpoint):
    argv = ["generate", "--model", tiny_checkpoint, "--prompt-ids", "1,2", "--cache-precision", "release",
            "--replay-mode", "compact", "--replay-keep", "64", "--max-model-len", "64", "--cache-mb", "8"]
    from deepinfer.entrypoints.cli.engine_args import llm_from_args

    llm = llm_from_args(build_parser().parse_args(argv))
    try:
        assert llm.engine.model.options == RuntimeOptions(cache_precision="release", replay_mode="compact",
                                                          replay_keep=64)
        out = llm.generate(prompt_token_ids=[[0, 5, 9]], sampling_params=GREEDY, use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == 6
    finally:
        llm.close()


@pytest.mark.parametrize("kwargs,match", [
    ({"cache_precision": "fp4"}, "cache_precision"),
    ({"replay_mode": "sometimes"}, "replay_mode"),
    ({"replay_mode": "mask", "replay_keep": 0}, "replay_keep"),
    ({"replay_keep": 200}, "replay_keep: needs replay_mode"),
    ({"max_model_len": 10**6}, "max_position_embeddings"),
    ({"dtype": "int8"}, "dtype"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization"),
])
def test_bad_settings_name_the_argument(tiny_checkpoint, kwargs, match):
    with pytest.raises(SettingError, match=match):
        LLM(tiny_checkpoint, **kwargs)


def test_dtype_and_cache_precision_defaults():
    from deepinfer.engine.loader import default_cache_precision, resolve_dtype

    assert resolve_dtype("auto", "cuda", "bfloat16") == "bfloat16"
    assert resolve_dtype("auto", "cpu", "bfloat16") == "float32"
    assert resolve_dtype("float16", "cpu", "bfloat16") == "float16"
    assert default_cache_precision("cuda") == "release" and default_cache_precision("cpu") == "exact"


def test_help_shows_each_default_once_and_log_level_after_the_command(capsys):
    texts = {}
    for command in ("generate", "chat", "bench", "score"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        texts[command] = text = " ".join(capsys.readouterr().out.split())
        assert "(default: None)" not in text and "(default: [])" not in text
        assert not re.search(r"\(default: [^()]*\) \(default:", text)  # never twice for one option
    assert "--top-k TOP_K keep the k most likely tokens; -1 or 0 disables (default: -1)" in texts["generate"]
    assert "--dtype {auto,bfloat16,float16,float32}" in texts["chat"] and "(default: auto)" in texts["chat"]
    args = build_parser().parse_args(["generate", "--model", "m", "--prompt", "x", "--log-level", "debug"])
    assert args.log_level == "DEBUG" and build_parser().parse_args(
        ["--log-level", "error", "generate", "--model", "m"]).log_level == "ERROR"
