"""Parity of our DeepSeek-V4.1 runtime with nemo-automodel 0.7.0's independent implementation.

The fixtures under fixtures/nemo/<config>_<seed>/ were recorded by tools/reference/record_all.sh in a
separate venv: nemo built its model and DSpark draft from the checkpoint our writer produces for
(config, seed), loaded it through its own state-dict adapter (bit-exact round trip checked) and ran
it in float32 with the cache quantisation boundaries off ("exact") and on ("release"). Only the
recipe is stored, so each test case first regenerates the checkpoint and checks its tensor digest.

Compared here:
* exact mode: full-sequence fp32 logits (one-shot, chunked, batched prefill) within 1e-3 max abs; greedy
  continuations identical wherever nemo's top-1/top-2 margin exceeds 1e-2 (teacher forced in the fast
  set, plus a few decode steps whose logits are checked against nemo's rows; the full 32-token decode
  is marked slow); Engram rows identical; per-layer top-k selections identical
  wherever nemo's k-th/(k+1)-th indexer score gap is above noise; DSpark base / Markov / confidence
  outputs (nemo's convention: teacher Markov inputs, confidence on the final-normed state).
* release mode (FP8/FP4 cache rounding): statistics only (max/mean abs, argmax agreement), with
  loose sanity bounds; the numbers are printed (run with -s to see them).
* bf16 compute (exact caches): statistics against nemo's fp32 logits, bounded relative to nemo's own
  bf16-vs-fp32 deviation on the same prompts (tiny random models are very sensitive to bf16).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# the recorder's own digest definitions (tools/ is not a package; the module needs only torch)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools" / "reference"))
from checkpoint_digest import file_digests, read_checkpoint, tensor_digest

FIXTURES = Path(__file__).parent / "fixtures" / "nemo"
CASE_DIRS = sorted(p.parent for p in FIXTURES.glob("*/meta.json"))

EXACT_LOGITS_ATOL = 1e-3  # issue 3: within 1e-3 max abs (aim 1e-4)
GREEDY_MARGIN = 1e-2  # greedy tokens must agree wherever nemo's top-1/top-2 margin exceeds this
TOPK_GAP = 1e-3  # compare selections only where the k-th/(k+1)-th score gap exceeds this
DSPARK_ATOL = 1e-3
CHUNK = 11  # odd prefill chunk for the chunked comparison (longest prompt)
DECODE_STEPS = 4  # one-token decode steps in the fast set (all 32 in the slow test)
RELEASE_MIN_ARGMAX_AGREEMENT = 0.8  # sanity bound only; FP8/FP4 rounding-bin flips are legitimate
# bf16 compute vs nemo's fp32 logits, judged against nemo's own bf16-vs-fp32 deviation (meta.json):
BF16_MEAN_ABS_RATIO = 1.5  # our mean abs deviation <= this x nemo's
BF16_ARGMAX_SLACK = 0.1  # our argmax agreement >= nemo's - this


# --------------------------------------------------------------------------- fixtures and recipe


@dataclass
class Case:
    name: str
    meta: dict
    exact: dict[str, torch.Tensor]
    release: dict[str, torch.Tensor]

    def prompts(self) -> list[str]:
        return sorted(self.meta["prompts"])


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
    files = file_digests(out)
    for name, digest in case.meta["file_digests"].items():
        assert files[name] == digest, (
            f"{case.name}: {name} is not the one the references were recorded for; {stale}"
        )
    assert tensor_digest(read_checkpoint(out)) == case.meta["checkpoint_digest"], (
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
            self._sink[self._layer_id] = sel.value.clone()
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


@dataclass
class Ours:
    """Our outputs for every prompt of a case, from one probed full-sequence forward each."""

    logits: dict[str, torch.Tensor]
    topk: dict[str, dict[int, torch.Tensor]]
    engram: dict[str, dict[int, torch.Tensor]]


def _run_prompts(runtime, case: Case, fixture: dict[str, torch.Tensor]) -> Ours:
    probe = Probe(runtime, case.meta["index_source_layers"])
    ours = Ours({}, {}, {})
    try:
        for p in case.prompts():
            probe.topk.clear()
            probe.engram.clear()
            ours.logits[p] = _score(runtime, fixture[f"{p}.tokens"].tolist())
            ours.topk[p] = dict(probe.topk)
            ours.engram[p] = dict(probe.engram)
    finally:
        probe.close()
    return ours



@pytest.fixture(scope="module")
def ours_exact(exact_model, case: Case) -> Ours:
    return _run_prompts(exact_model, case, case.exact)


def _longest(case: Case) -> str:
    return max(case.prompts(), key=lambda p: len(case.meta["prompts"][p]))


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


def _split(case: Case, fixture: dict[str, torch.Tensor], p: str) -> tuple[list[int], list[int], list[float]]:
    full = fixture[f"{p}.tokens"].tolist()
    greedy = fixture[f"{p}.greedy"].tolist()
    return full[: len(full) - len(greedy)], greedy, fixture[f"{p}.greedy_margin"].tolist()


def _check_greedy(case: Case, p: str, ours: list[int], ref: list[int], margins: list[float]) -> int:
    """Tokens must agree until the first step where nemo's margin is within noise; returns the count."""
    agreeing = 0
    for j, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            assert margins[j] <= GREEDY_MARGIN, f"{p} step {j}: {a} != {b} (nemo margin {margins[j]:.3g})"
            break
        agreeing += 1
    return agreeing


# --------------------------------------------------------------------------- exact mode


def test_checkpoint_regenerates(checkpoint: Path, case: Case):
    assert (checkpoint / "config.json").exists()


def test_exact_full_sequence_logits(ours_exact: Ours, case: Case):
    worst, per_prompt = 0.0, {}
    for p in case.prompts():
        ref = case.exact[f"{p}.logits"]
        ours = ours_exact.logits[p]
        assert ours.shape == ref.shape
        diff = (ours - ref).abs().max().item()
        per_prompt[p] = diff
        worst = max(worst, diff)
    _report(case, "exact logits max abs", worst=worst, **per_prompt)
    assert worst <= EXACT_LOGITS_ATOL


def test_exact_chunked_prefill_logits(exact_model, case: Case):
    p = _longest(case)
    ours = _score(exact_model, case.exact[f"{p}.tokens"].tolist(), chunk=CHUNK)
    diff = (ours - case.exact[f"{p}.logits"]).abs().max().item()
    _report(case, f"exact chunked prefill (chunk {CHUNK}) max abs", **{p: diff})
    assert diff <= EXACT_LOGITS_ATOL


def test_exact_batched_prefill(exact_model, case: Case):
    """All prompts in one forward (one slot each, prefill split in two uneven chunks): per-row logits."""
    from deepinfer.models.interface import ForwardBatch, SequenceSegment

    prompts = [case.exact[f"{p}.tokens"].tolist() for p in case.prompts()]
    block = exact_model.cache_layout().block_size
    tables, next_block = [], 1
    for tokens in prompts:
        n = -(-len(tokens) // block)
        tables.append(list(range(next_block, next_block + n)))
        next_block += n
    exact_model.allocate_cache(next_block, len(prompts) + 1)
    for slot in range(1, len(prompts) + 1):
        exact_model.reset_slot(slot)
    cuts = [len(t) // 3 + 1 for t in prompts]
    chunks = (
        [
            SequenceSegment(i + 1, tables[i], 0, t[:c], logits="all")
            for i, (t, c) in enumerate(zip(prompts, cuts))
        ],
        [
            SequenceSegment(i + 1, tables[i], c, t[c:], logits="all")
            for i, (t, c) in enumerate(zip(prompts, cuts))
        ],
    )
    parts = []
    for segs in chunks:
        out = exact_model.forward(ForwardBatch(segs))
        parts.append(
            [out.logits[out.row_offsets[i] : out.row_offsets[i + 1]].float() for i in range(len(segs))]
        )
    worst = 0.0
    for i, p in enumerate(case.prompts()):
        ours = torch.cat((parts[0][i], parts[1][i]))
        diff = (ours - case.exact[f"{p}.logits"]).abs().max().item()
        worst = max(worst, diff)
        assert diff <= EXACT_LOGITS_ATOL, f"{p} in a batch: max abs {diff:.3g}"
    _report(case, "exact batched prefill (all prompts, 2 chunks) max abs", worst=worst)


def test_exact_greedy_teacher_forced(ours_exact: Ours, case: Case):
    """Our argmax along nemo's greedy continuation = nemo's greedy tokens where margins allow."""
    agreeing = total = 0
    for p in case.prompts():
        prompt, ref, margins = _split(case, case.exact, p)
        ours = ours_exact.logits[p][len(prompt) - 1 : -1].argmax(-1).tolist()
        agreeing += _check_greedy(case, p, ours, ref, margins)
        total += len(ref)
    _report(case, "exact greedy (teacher forced)", tokens_agreeing=f"{agreeing}/{total}")


def test_exact_decode_steps(exact_model, case: Case):
    """Prefill + DECODE_STEPS one-token decodes: logits of each step against nemo's rows."""
    p = _longest(case)
    prompt, ref, margins = _split(case, case.exact, p)
    ours, step_logits = _greedy(exact_model, prompt, DECODE_STEPS)
    ref_logits = case.exact[f"{p}.logits"]
    worst = 0.0
    for j in range(_check_greedy(case, p, ours, ref, margins)):
        worst = max(worst, (step_logits[j] - ref_logits[len(prompt) - 1 + j]).abs().max().item())
    _report(case, f"exact decode ({DECODE_STEPS} steps) max abs", **{p: worst})
    assert worst <= EXACT_LOGITS_ATOL


@pytest.mark.slow
def test_exact_greedy_decode_32(exact_model, case: Case):
    agreeing = total = 0
    worst = 0.0
    for p in case.prompts():
        prompt, ref, margins = _split(case, case.exact, p)
        ours, step_logits = _greedy(exact_model, prompt, len(ref))
        n = _check_greedy(case, p, ours, ref, margins)
        for j in range(n):
            worst = max(
                worst, (step_logits[j] - case.exact[f"{p}.logits"][len(prompt) - 1 + j]).abs().max().item()
            )
        agreeing += n
        total += len(ref)
    _report(case, "exact greedy decode", tokens_agreeing=f"{agreeing}/{total}", decode_max_abs=worst)
    assert worst <= EXACT_LOGITS_ATOL


def test_exact_topk_selections(ours_exact: Ours, case: Case):
    layers = case.meta["index_source_layers"]
    if not layers:
        pytest.skip("no compressed layers in this config")
    checked = skipped = 0
    for p in case.prompts():
        for layer in layers:
            ref = case.exact[f"{p}.topk.{layer}"]
            gap = case.exact[f"{p}.topk_gap.{layer}"]
            ours = ours_exact.topk[p][layer]
            assert ours.shape[0] == ref.shape[0], f"{p} layer {layer}: rows {ours.shape} vs {ref.shape}"
            for row in range(ref.shape[0]):
                if not gap[row] > TOPK_GAP:
                    skipped += 1
                    continue
                want = sorted(v for v in ref[row].tolist() if v >= 0)
                got = sorted(v for v in ours[row].tolist() if v >= 0)
                assert got == want, f"{p} layer {layer} row {row}: {got} != {want} (gap {gap[row]:.3g})"
                checked += 1
    assert checked > 0
    _report(case, "top-k", rows_identical=checked, near_ties_skipped=skipped)


def test_engram_rows(ours_exact: Ours, case: Case):
    if not any(k.endswith(".engram_rows") for k in case.exact):
        pytest.skip("no Engram layers in this config")
    for p in case.prompts():
        ref = case.exact[f"{p}.engram_rows"]  # [prompt, engram layers, hash heads]
        for k in range(ref.shape[1]):
            ours = ours_exact.engram[p][k].to(torch.int64).cpu()[: ref.shape[0]]  # causal: prefix rows
            assert torch.equal(ours, ref[:, k]), f"{p} Engram layer #{k}"


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
    p = _longest(case)
    ref = case.release[f"{p}.logits"]
    layers = case.meta["index_source_layers"]
    probe = Probe(release_model, layers)
    try:
        ours = _score(release_model, case.release[f"{p}.tokens"].tolist())
    finally:
        probe.close()
    same = clear = 0
    for layer in layers:
        gap = case.release[f"{p}.topk_gap.{layer}"]
        for row, (a, b) in enumerate(
            zip(probe.topk[layer].tolist(), case.release[f"{p}.topk.{layer}"].tolist())
        ):
            if gap[row] > TOPK_GAP:
                clear += 1
                same += sorted(v for v in a if v >= 0) == sorted(v for v in b if v >= 0)
    assert ours.shape == ref.shape
    assert torch.isfinite(ours).all()
    d = (ours - ref).abs()
    prompt, greedy, _ = _split(case, case.release, p)
    tf = ours[len(prompt) - 1 : -1].argmax(-1).tolist()
    prefix = next((j for j, (a, b) in enumerate(zip(tf, greedy)) if a != b), len(greedy))
    stats = {
        "max_abs": d.max().item(),
        "mean_abs": d.mean().item(),
        "argmax_agreement": (ours.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        "greedy_teacher_forced_prefix": f"{prefix}/{len(greedy)}",
        "topk_rows_identical": f"{same}/{clear}",
    }
    if case.meta["dspark"] is not None:
        stats.update(
            {f"dspark_{k}": v for k, v in _check_dspark(release_model, case, case.release, None).items()}
        )
    _report(case, f"release (cache quantisation on) {p}", **stats)
    assert stats["argmax_agreement"] >= RELEASE_MIN_ARGMAX_AGREEMENT


@pytest.mark.slow
def test_release_greedy_decode_32(release_model, case: Case):
    same = total = 0
    for p in case.prompts():
        prompt, ref, _ = _split(case, case.release, p)
        ours, _ = _greedy(release_model, prompt, len(ref))
        same += next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ref))
        total += len(ref)
    _report(case, "release greedy decode", agreeing_prefix_tokens=f"{same}/{total}")


def test_bf16_statistics(checkpoint: Path, case: Case):
    nemo = case.meta.get("bf16_reference")
    if not nemo:
        pytest.skip("fixture recorded without nemo's bf16 yardstick")
    rt = _runtime_module()
    model = rt.load_runtime(
        checkpoint, dtype=torch.bfloat16, options=rt.RuntimeOptions(cache_precision="exact")
    )
    ours_mean, ours_agree, stats = [], [], {}
    for p in case.prompts():
        ref = case.exact[f"{p}.logits"]
        ours = _score(model, case.exact[f"{p}.tokens"].tolist())
        assert torch.isfinite(ours).all()
        d = (ours - ref).abs()
        ours_mean.append(d.mean().item())
        ours_agree.append((ours.argmax(-1) == ref.argmax(-1)).float().mean().item())
        stats[f"{p}_max_abs"] = d.max().item()
    nemo_mean = sum(v["mean_abs"] for v in nemo.values()) / len(nemo)
    nemo_agree = sum(v["argmax_agreement"] for v in nemo.values()) / len(nemo)
    mean, agree = sum(ours_mean) / len(ours_mean), sum(ours_agree) / len(ours_agree)
    _report(
        case,
        "bf16 compute vs nemo fp32",
        mean_abs=mean,
        nemo_bf16_mean_abs=nemo_mean,
        argmax_agreement=agree,
        nemo_bf16_argmax_agreement=nemo_agree,
        **stats,
    )
    assert mean <= BF16_MEAN_ABS_RATIO * nemo_mean
    assert agree >= nemo_agree - BF16_ARGMAX_SLACK
