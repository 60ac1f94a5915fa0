"""The shipped default model (checkpoints/tiny-stdlib, trained by tools/train; docs/training.md).

It loads through our loader with every V4.1 layer kind, `deepinfer generate` uses it without --model,
its held-out loss stays under a recorded bound, and its completions of function headers are Python.
The held-out material is frozen in fixtures/default_model/heldout.json (tools/train/fixtures.py), so
the numbers do not depend on the Python that runs the tests.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from deepinfer import LLM, SamplingParams
from deepinfer.checkpoint.loader import load_checkpoint
from deepinfer.config import load_model_config
from deepinfer.entrypoints.cli.generate import default_model_dir
from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, load_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment

MODEL = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-stdlib"
FIXTURES = Path(__file__).parent / "fixtures" / "default_model"
FIXTURE = json.loads((FIXTURES / "heldout.json").read_text())
NEMO_ATOL = 1e-3  # fp32, cache quantisation off on both sides

# REGRESSION GUARDS, not quality targets: measured on the shipped weights (2026-12-01, CPU, float32,
# exact cache) plus a margin; a change to the runtime or the weights that breaks the model trips them.
HELD_OUT_LOSS = 3.292  # measured on the first 4 fixture windows (all 8: 3.595)
HELD_OUT_LOSS_BOUND = HELD_OUT_LOSS + 0.05
AST_SHARE = 0.28  # measured: 18 of the 64 fixture headers' 48-token greedy completions parse
AST_SHARE_MIN = 0.2


def test_the_default_model_is_shipped_and_complete() -> None:
    assert Path(default_model_dir()) == MODEL
    files = sorted(p.name for p in MODEL.iterdir())
    assert "tokenizer.json" in files and "model.safetensors.index.json" in files
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 25 * 1024**2
    text = load_model_config(MODEL / "config.json").text
    roles = {s.role for s in text.layers}
    assert roles == {"swa", "full", "reuse", "reindex", "dspark"}
    assert {s.compress_ratio for s in text.layers if s.role == "full"} == {1, 2}
    assert any(s.is_candidate_source for s in text.layers)
    assert any(s.restricted_to_candidates for s in text.layers)
    assert any(s.is_engram for s in text.layers) and any(s.is_yoco_consumer for s in text.layers)
    assert text.num_nextn_predict_layers == 3
    stored = load_checkpoint(MODEL, progress=False).tensors
    assert stored["layers.0.ffn.experts.0.w1.weight"].dtype == torch.int8  # FP4 experts
    assert stored["layers.0.attn.wq_a.weight"].dtype == torch.float8_e4m3fn


def test_held_out_loss_regression_guard() -> None:
    rt = load_runtime(MODEL, options=RuntimeOptions(cache_precision="exact"))
    windows = [torch.tensor(w) for w in FIXTURE["windows"][:4]]
    logits = rt.score([w[:-1].tolist() for w in windows])
    loss = torch.stack([F.cross_entropy(lg, w[1:], reduction="sum") for lg, w in zip(logits, windows)])
    mean = loss.sum().item() / sum(w.numel() - 1 for w in windows)
    assert mean < HELD_OUT_LOSS_BOUND, f"held-out loss {mean:.4f} (recorded {HELD_OUT_LOSS})"


def test_logits_and_drafts_match_nemo_automodel() -> None:
    """Against nemo-automodel 0.7.0's DeepseekV41ForCausalLM and DSpark model on the shipped weights
    (fixture recorded by tools/reference, see fixtures/default_model/nemo_meta.json)."""
    ref = load_file(str(FIXTURES / "nemo_exact.safetensors"))
    meta = json.loads((FIXTURES / "nemo_meta.json").read_text())
    for shard, digest in meta["shard_sha256"].items():
        assert hashlib.sha256((MODEL / shard).read_bytes()).hexdigest() == digest, f"re-record: {shard}"
    rt = load_runtime(MODEL, options=RuntimeOptions(cache_precision="exact"))
    tokens = ref["p0.tokens"].tolist()
    assert (rt.score([tokens])[0] - ref["p0.logits"]).abs().max().item() < NEMO_ATOL
    a = int(ref["dspark.anchors"][0])
    rt.allocate_cache(2, 2)
    rt.reset_slot(1)
    rt.forward(ForwardBatch([SequenceSegment(1, [1], 0, tokens[:a], "none")]))
    out = rt.dspark.draft(rt.cache, [1], [a], [tokens[a]])
    markov, embedding = rt.dspark.markov(torch.tensor([tokens[a : a + rt.dspark.block_size]]))
    ours = {
        "base_logits": out.base_logits[0],
        "markov_logits": markov[0],
        "confidence_logits": rt.dspark.confidence(out, embedding, source="normed")[0],  # nemo's convention
    }
    for key, value in ours.items():
        assert (value - ref[f"dspark.{key}"]).abs().max().item() < NEMO_ATOL, key


def parses_after_line_cut(header: str, completion: str) -> bool:
    """header + completion, cut at the completion's last line boundary, is valid Python."""
    if "\n" not in completion:
        return False
    text = header + completion
    try:
        ast.parse(text[: text.rfind("\n")])
    except SyntaxError:
        return False
    return True


@pytest.mark.slow
def test_function_header_completions_parse() -> None:
    headers = FIXTURE["headers"]
    llm = LLM(model=str(MODEL))
    try:
        outs = llm.generate(headers, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    finally:
        llm.close()
    share = sum(parses_after_line_cut(h, o.outputs[0].text) for h, o in zip(headers, outs)) / len(headers)
    assert share >= AST_SHARE_MIN, f"{share:.2f} of completions parse (recorded {AST_SHARE})"


def test_line_cut_rule() -> None:
    assert parses_after_line_cut("def f(x):", "\n    return x\n    if")
    assert not parses_after_line_cut("def f(x):", "\n    if x:\n        y = (")
    assert not parses_after_line_cut("def f(x):", " pass")
