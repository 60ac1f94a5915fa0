"""Parity of our DeepSeek-V4.1 runtime with nemo-automodel 0.7.0's independent implementation.

The fixtures under fixtures/nemo/<config>_<seed>/ were recorded by tools/reference/record_all.sh in a
separate venv: nemo built its model and DSpark draft from the checkpoint our writer produces for
(config, seed), loaded it through its own state-dict adapter (bit-exact round trip checked) and ran
it in float32 with the cache quantisation boundaries off ("exact") and on ("release"). Only the
recipe is stored, so each test case first regenerates the checkpoint and checks its tensor digest.

Compared here:
* exact mode: full-sequence fp32 logits (one-shot and chunked prefill) within 1e-3 max abs; greedy
  continuations identical wherever nemo's top-1/top-2 margin exceeds 1e-2 (decode logits checked
  against nemo's teacher-forced rows); Engram rows identical; per-layer top-k selections identical
  wherever nemo's k-th/(k+1)-th indexer score gap is above noise; DSpark base / Markov / confidence
  outputs (nemo's convention: teacher Markov inputs, confidence on the final-normed state).
* release mode (FP8/FP4 cache rounding): statistics only (max/mean abs, argmax agreement), with
  loose sanity bounds; the numbers are printed (run with -s to see them).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures" / "nemo"
CASE_DIRS = sorted(p.parent for p in FIXTURES.glob("*/meta.json"))

EXACT_LOGITS_ATOL = 1e-3  # issue 3: within 1e-3 max abs (aim 1e-4)
GREEDY_MARGIN = 1e-2  # greedy tokens must agree wherever nemo's top-1/top-2 margin exceeds this
TOPK_GAP = 1e-3  # compare selections only where the k-th/(k+1)-th score gap exceeds this
DSPARK_ATOL = 1e-3
CHUNK = 5  # odd prefill chunk for the chunked comparison
RELEASE_MIN_ARGMAX_AGREEMENT = 0.8  # sanity bound only; FP8/FP4 rounding-bin flips are legitimate


# --------------------------------------------------------------------------- fixtures and recipe


@dataclass
class Case:
    name: str
    meta: dict
    exact: dict[str, torch.Tensor]
    release: dict[str, torch.Tensor]

    def prompts(self) -> list[str]:
        return sorted(self.meta["prompts"])


def _tensor_digest(ckpt: Path) -> str:
    """sha256 over (name, dtype, shape, raw bytes) in name order (same definition as the recorder)."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(ckpt / shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = f.get_tensor(name)
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _file_digests(ckpt: Path) -> dict[str, str]:
    config = json.loads((ckpt / "config.json").read_text())
    return {
        "config.json": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
        "tokenizer.json": hashlib.sha256((ckpt / "tokenizer.json").read_bytes()).hexdigest(),
    }


def _write_checkpoint(config_name: str, seed: int, out: Path) -> None:
    """Our deterministic writer, as `deepinfer make-checkpoint --config NAME --seed N --out DIR` runs it."""
    from deepinfer.checkpoint.writer import write_checkpoint
    from deepinfer.testing.configs import tiny_config
    from deepinfer.tokenizer.bundled import tokenizer_for

    config = tiny_config(config_name)
    write_checkpoint(config, out, seed=seed, tokenizer=tokenizer_for(config), progress=False)


@pytest.fixture(scope="module", params=CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def case(request) -> Case:
    d: Path = request.param
    meta = json.loads((d / "meta.json").read_text())
    return Case(
        d.name, meta, load_file(str(d / "exact.safetensors")), load_file(str(d / "release.safetensors"))
    )


@pytest.fixture(scope="module")
def checkpoint(case: Case, tmp_path_factory) -> Path:
    recipe = case.meta["recipe"]
    out = tmp_path_factory.mktemp(case.name) / "ckpt"
    _write_checkpoint(recipe["config_name"], recipe["seed"], out)
    stale = "re-record the nemo references with tools/reference/record_all.sh"
    files = _file_digests(out)
    for name, digest in case.meta["file_digests"].items():
        assert files[name] == digest, (
            f"{case.name}: {name} is not the one the references were recorded for; {stale}"
        )
    assert _tensor_digest(out) == case.meta["checkpoint_digest"], (
        f"{case.name}: the writer's tensors changed since the references were recorded; {stale}"
    )
    return out


def _runtime_module():
    return pytest.importorskip(
        "deepinfer.models.deepseek_v41.runtime", reason="DeepSeek-V4.1 runtime not available yet"
    )


def _load(checkpoint: Path, precision: str):
    rt = _runtime_module()
    return rt.load_runtime(
        checkpoint, dtype=torch.float32, options=rt.RuntimeOptions(cache_precision=precision)
    )


@pytest.fixture(scope="module")
def exact_model(checkpoint: Path):
    return _load(checkpoint, "exact")


@pytest.fixture(scope="module")
def release_model(checkpoint: Path):
    return _load(checkpoint, "release")


# --------------------------------------------------------------------------- probes on our runtime


class _RecordingAttention:
    """Delegates to a layer's attention and records the top-k selection it publishes."""

    def __init__(self, inner, layer_id: int, sink: dict[int, torch.Tensor]):
        self._inner, self._layer_id, self._sink = inner, layer_id, sink

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, x, step):
        y = self._inner(x, step)
        sel = getattr(step, "topk", None)
        if sel is not None and sel.source == self._layer_id:
            self._sink[self._layer_id] = torch.cat(sel.per_segment).clone()
        return y


class Probe:
    """Top-k selections of every index-source layer and the Engram rows of the last forward."""

    def __init__(self, runtime, layers: list[int]):
        self.topk: dict[int, torch.Tensor] = {}
        self.engram: dict[int, torch.Tensor] = {}
        self._runtime = runtime
        self._saved = []
        for blk in runtime.model.blocks:
            if blk.spec.index in layers:
                self._saved.append((blk, blk.attn))
                blk.attn = _RecordingAttention(blk.attn, blk.spec.index, self.topk)
        hasher = runtime.model.hasher
        if hasher is not None:
            original = hasher.rows

            def rows(k, ngrams):
                out = original(k, ngrams)
                self.engram[k] = out.clone()
                return out

            hasher.rows = rows
            self._hasher = hasher

    def close(self):
        for blk, attn in self._saved:
            blk.attn = attn
        if self._runtime.model.hasher is not None:
            del self._hasher.rows


def _score(runtime, tokens: list[int], chunk: int | None = None) -> torch.Tensor:
    return runtime.score([tokens], chunk=chunk)[0].float()


def _greedy(runtime, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill + one-token decodes through the engine interface, with the logits of each step."""
    from deepinfer.models.interface import ForwardBatch, SequenceSegment

    block = runtime.cache_layout().block_size
    blocks = -(-(len(prompt) + steps) // block)
    runtime.allocate_cache(blocks + 1, 2)
    runtime.reset_slot(1)
    table = list(range(1, blocks + 1))
    out = runtime.forward(ForwardBatch([SequenceSegment(1, table, 0, list(prompt), logits="last")]))
    tokens, step_logits = [], []
    for _ in range(steps):
        logits = out.logits[-1].float()
        step_logits.append(logits)
        tokens.append(int(logits.argmax()))
        pos = len(prompt) + len(tokens) - 1
        out = runtime.forward(ForwardBatch([SequenceSegment(1, table, pos, [tokens[-1]], logits="last")]))
    return tokens, step_logits


def _report(case: Case, what: str, **numbers) -> None:
    text = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())
    print(f"[nemo parity] {case.name} {what}: {text}")


# --------------------------------------------------------------------------- exact mode


def test_checkpoint_regenerates(checkpoint: Path, case: Case):
    assert (checkpoint / "config.json").exists()


def test_exact_full_sequence_logits(exact_model, case: Case):
    worst = 0.0
    for p in case.prompts():
        tokens = case.exact[f"{p}.tokens"].tolist()
        ref = case.exact[f"{p}.logits"]
        for chunk in (None, CHUNK):
            ours = _score(exact_model, tokens, chunk)
            assert ours.shape == ref.shape
            diff = (ours - ref).abs().max().item()
            worst = max(worst, diff)
            assert diff <= EXACT_LOGITS_ATOL, f"{p} chunk={chunk}: max abs {diff:.3g}"
    _report(case, "exact logits", max_abs=worst)


def test_exact_greedy_continuation(exact_model, case: Case):
    compared = 0
    worst = 0.0
    for p in case.prompts():
        full = case.exact[f"{p}.tokens"].tolist()
        ref_tokens = case.exact[f"{p}.greedy"].tolist()
        margins = case.exact[f"{p}.greedy_margin"].tolist()
        prompt = full[: len(full) - len(ref_tokens)]
        ours, step_logits = _greedy(exact_model, prompt, len(ref_tokens))
        ref_logits = case.exact.get(f"{p}.logits")
        for j, (a, b) in enumerate(zip(ours, ref_tokens)):
            if ref_logits is not None:
                diff = (step_logits[j] - ref_logits[len(prompt) - 1 + j]).abs().max().item()
                worst = max(worst, diff)
                assert diff <= EXACT_LOGITS_ATOL, f"{p} decode step {j}: max abs {diff:.3g}"
            if a != b:
                assert margins[j] <= GREEDY_MARGIN, f"{p} step {j}: {a} != {b} (nemo margin {margins[j]:.3g})"
                break
            compared += 1
    _report(case, "exact greedy", tokens_agreeing=compared, decode_logits_max_abs=worst)


def test_exact_topk_selections(exact_model, case: Case):
    layers = case.meta["index_source_layers"]
    if not layers:
        pytest.skip("no compressed layers in this config")
    probe = Probe(exact_model, layers)
    checked = skipped = 0
    try:
        for p in case.prompts():
            tokens = case.exact[f"{p}.tokens"].tolist()
            _score(exact_model, tokens)
            for layer in layers:
                ref = case.exact[f"{p}.topk.{layer}"]
                gap = case.exact[f"{p}.topk_gap.{layer}"]
                ours = probe.topk[layer]
                assert ours.shape[0] == ref.shape[0], f"{p} layer {layer}: rows {ours.shape} vs {ref.shape}"
                for row in range(ref.shape[0]):
                    if not gap[row] > TOPK_GAP:
                        skipped += 1
                        continue
                    want = sorted(v for v in ref[row].tolist() if v >= 0)
                    got = sorted(v for v in ours[row].tolist() if v >= 0)
                    assert got == want, f"{p} layer {layer} row {row}: {got} != {want} (gap {gap[row]:.3g})"
                    checked += 1
    finally:
        probe.close()
    assert checked > 0
    _report(case, "top-k", rows_identical=checked, near_ties_skipped=skipped)


def test_engram_rows(exact_model, case: Case):
    if not any(k.endswith(".engram_rows") for k in case.exact):
        pytest.skip("no Engram layers in this config")
    probe = Probe(exact_model, [])
    try:
        for p in case.prompts():
            ref = case.exact[f"{p}.engram_rows"]  # [seq, engram layers, hash heads]
            n = ref.shape[0]
            _score(exact_model, case.exact[f"{p}.tokens"].tolist()[:n])
            for k in range(ref.shape[1]):
                assert torch.equal(probe.engram[k].to(torch.int64).cpu(), ref[:, k]), f"{p} Engram layer #{k}"
    finally:
        probe.close()


def _dspark_outputs(runtime, tokens: list[int], anchors: list[int], block: int) -> dict[str, torch.Tensor]:
    """For each anchor a: prefill tokens[:a], then draft with golden tokens[a] at position a."""
    from deepinfer.models.interface import ForwardBatch, SequenceSegment

    dspark = runtime.dspark
    cache_block = runtime.cache_layout().block_size
    blocks = -(-len(tokens) // cache_block)
    runtime.allocate_cache(blocks + 1, 2)
    table = list(range(1, blocks + 1))
    base, markov, conf = [], [], []
    for a in anchors:
        runtime.reset_slot(1)
        runtime.forward(ForwardBatch([SequenceSegment(1, table, 0, tokens[:a], logits="none")]))
        out = dspark.draft(runtime.cache, [1], [a], [tokens[a]])
        prev = torch.tensor([tokens[a : a + block]], device=out.base_logits.device)
        m_logits, m_embed = dspark.markov(prev)
        base.append(out.base_logits[0].float())
        markov.append(m_logits[0].float())
        conf.append(dspark.confidence(out, m_embed, source="normed")[0].float())
    return {
        "base_logits": torch.cat(base),
        "markov_logits": torch.cat(markov),
        "confidence_logits": torch.cat(conf),
    }


def _check_dspark(runtime, case: Case, fixture: dict[str, torch.Tensor], atol: float | None) -> dict:
    info = case.meta["dspark"]
    p = case.meta["summary"]["exact"]["dspark_prompt"]
    tokens = fixture[f"{p}.tokens"].tolist()
    anchors = fixture["dspark.anchors"].tolist()
    ours = _dspark_outputs(runtime, tokens, anchors, info["block_size"])
    stats = {}
    for key, value in ours.items():
        ref = fixture[f"dspark.{key}"]
        assert value.shape == ref.shape, f"{key}: {tuple(value.shape)} vs {tuple(ref.shape)}"
        diff = (value.cpu() - ref).abs().max().item()
        stats[key] = diff
        if atol is not None:
            assert diff <= atol, f"DSpark {key}: max abs {diff:.3g}"
    return stats


def test_exact_dspark(exact_model, case: Case):
    if case.meta["dspark"] is None:
        pytest.skip("no DSpark blocks in this config")
    stats = _check_dspark(exact_model, case, case.exact, DSPARK_ATOL)
    _report(case, "exact DSpark max abs", **stats)


# --------------------------------------------------------------------------- release mode (statistics)


def test_release_statistics(release_model, case: Case):
    rows = agree = 0
    max_abs = sum_abs = 0.0
    count = 0
    for p in case.prompts():
        ref = case.release.get(f"{p}.logits")
        if ref is None:
            continue
        ours = _score(release_model, case.release[f"{p}.tokens"].tolist())
        assert ours.shape == ref.shape
        assert torch.isfinite(ours).all()
        d = (ours - ref).abs()
        max_abs = max(max_abs, d.max().item())
        sum_abs += d.sum().item()
        count += d.numel()
        agree += int((ours.argmax(-1) == ref.argmax(-1)).sum())
        rows += ref.shape[0]
    greedy_same = greedy_total = 0
    for p in case.prompts():
        full = case.release[f"{p}.tokens"].tolist()
        ref_tokens = case.release[f"{p}.greedy"].tolist()
        margins = case.release[f"{p}.greedy_margin"].tolist()
        ours, _ = _greedy(release_model, full[: len(full) - len(ref_tokens)], len(ref_tokens))
        for a, b, m in zip(ours, ref_tokens, margins):
            if a != b or not math.isfinite(m):
                break
            greedy_same += 1
        greedy_total += len(ref_tokens)
    stats = {
        "max_abs": max_abs,
        "mean_abs": sum_abs / max(count, 1),
        "argmax_agreement": agree / max(rows, 1),
        "greedy_prefix_agreeing": f"{greedy_same}/{greedy_total}",
    }
    if case.meta["dspark"] is not None:
        stats.update(
            {f"dspark_{k}": v for k, v in _check_dspark(release_model, case, case.release, None).items()}
        )
    _report(case, "release (cache quantisation on)", **stats)
    assert stats["argmax_agreement"] >= RELEASE_MIN_ARGMAX_AGREEMENT
