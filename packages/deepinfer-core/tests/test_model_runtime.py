"""Stateful execution of the whole model on every tiny config: a batch of sequences at different positions
through chunked prefill (odd sizes), decode, multi-token verification and rollback must give the logits of
a full recompute; bounded replay modes agree; release cache precision is reported against exact."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, load_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing import TINY_CONFIG_NAMES, write_tiny_checkpoint

EXACT_TOL = 1e-4
YOCO_CONFIGS = ("c1_yoco", "reindex", "full")



@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {name: str(write_tiny_checkpoint(name, tmp_path_factory.mktemp(name), seed=1))
            for name in TINY_CONFIG_NAMES}


@dataclass
class Driver:
    """Feeds segments to a runtime and records (token prefix, logits row) for every returned row."""

    rt: DeepseekV41Runtime
    tokens: dict[int, list[int]] = field(default_factory=dict)  # slot -> tokens currently in the cache
    records: list[tuple[tuple[int, ...], torch.Tensor]] = field(default_factory=list)
    device_ids: bool = False  # pass input_ids; the lists' last entries become stand-ins (-1)

    def step(self, parts: list[tuple[int, int, list[int], str]]) -> torch.Tensor:
        """parts: (slot, start_pos, new tokens, logits) per segment; start_pos < len means rollback."""
        segs = []
        for slot, start, new, logits in parts:
            seq = self.tokens.setdefault(slot, [])
            assert start <= len(seq)
            seq[start:] = new
            segs.append(SequenceSegment(slot, [slot], start, list(new), logits))
        input_ids = None
        if self.device_ids:  # what the engine passes under async scheduling
            input_ids = torch.tensor([t for s in segs for t in s.token_ids])
            for s in segs:
                s.token_ids[-1] = -1
        out = self.rt.forward(ForwardBatch(segs, input_ids))
        for i, seg in enumerate(segs):
            rows = out.logits[out.row_offsets[i] : out.row_offsets[i + 1]]
            end = seg.start_pos + len(seg.token_ids)
            positions = (
                range(seg.start_pos, end) if seg.logits == "all" else [end - 1] * (seg.logits == "last")
            )
            for pos, row in zip(positions, rows):
                self.records.append((tuple(self.tokens[seg.slot][: pos + 1]), row))
        return out.logits

    def max_error_vs_recompute(self) -> float:
        prefixes = [p for p, _ in self.records]
        maximal = [
            p for p in set(prefixes) if not any(len(q) > len(p) and q[: len(p)] == p for q in prefixes)
        ]
        ref = dict(zip(maximal, self.rt.score(maximal)))
        err = 0.0
        for prefix, row in self.records:
            full = next(q for q in maximal if q[: len(prefix)] == prefix)
            err = max(err, (ref[full][len(prefix) - 1] - row).abs().max().item())
        return err


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _scenario(d: Driver) -> None:
    """Three sequences at different positions, odd chunks, decode, verification, rollback."""
    v = d.rt.vocab_size
    a, b, c = _ids(29, 1, v), _ids(23, 2, v), _ids(17, 3, v)
    d.rt.allocate_cache(num_blocks=4, num_slots=4)
    for slot in (1, 2, 3):
        d.rt.reset_slot(slot)
    d.step([(1, 0, a[:5], "last"), (2, 0, b[:11], "all")])
    d.step([(1, 5, a[5:16], "all"), (2, 11, b[11:], "last"), (3, 0, c, "all")])
    d.step([(1, 16, a[16:], "last"), (2, 23, _ids(1, 4, v), "last"), (3, 17, _ids(1, 5, v), "last")])
    d.step([(1, 29, _ids(4, 6, v), "all"), (2, 24, _ids(3, 7, v), "all"), (3, 18, _ids(1, 8, v), "last")])
    # rollback: reject the last 2 (seq 1) and 1 (seq 2) verified tokens, then verify new drafts
    d.step([(1, 31, _ids(3, 9, v), "all"), (2, 26, _ids(2, 10, v), "all"), (3, 19, _ids(1, 11, v), "last")])
    d.step([(1, 34, _ids(1, 12, v), "last"), (3, 20, _ids(5, 13, v), "all")])
    # roll back the full max_backtrack (4) of seq 3, decode seq 1
    d.step([(3, 21, _ids(2, 14, v), "all"), (1, 35, _ids(1, 15, v), "last")])


@pytest.mark.parametrize("name", TINY_CONFIG_NAMES)
def test_stateful_steps_equal_full_recompute(checkpoints: dict[str, str], name: str) -> None:
    rt = load_runtime(checkpoints[name], options=RuntimeOptions(max_backtrack=4))
    d = Driver(rt)
    _scenario(d)
    assert len(d.records) > 60
    err = d.max_error_vs_recompute()
    assert err < EXACT_TOL, f"{name}: max |logit diff| {err:.3g}"


def test_device_input_ids_are_the_token_values(checkpoints: dict[str, str]) -> None:
    """`ForwardBatch.input_ids` (async scheduling) drives the embedding and the Engram id history; the
    lists' stand-ins are never read."""
    rt = load_runtime(checkpoints["full"], options=RuntimeOptions(max_backtrack=4))
    assert rt.model.hasher is not None
    d = Driver(rt, device_ids=True)
    _scenario(d)
    err = d.max_error_vs_recompute()
    assert err < EXACT_TOL, f"max |logit diff| {err:.3g}"


def _replay_logits(path: str, mode: str, keep: int, prompt: list[int]) -> list[torch.Tensor]:
    rt = load_runtime(path, options=RuntimeOptions(max_backtrack=4, replay_mode=mode, replay_keep=keep))
    d = Driver(rt)
    rt.allocate_cache(num_blocks=3, num_slots=3)
    outs = [d.step([(1, 0, prompt, "last"), (2, 0, prompt[:19], "last")])]
    for i in range(3):
        outs.append(d.step([(1, len(prompt) + i, [7 + i], "last"), (2, 19 + i, [9 + i], "last")]))
    outs.append(d.step([(1, len(prompt) + 3, [5, 6, 7], "all")]))
    outs.append(d.step([(1, len(prompt) + 4, [8], "last")]))  # rollback of 2
    return outs


@pytest.mark.parametrize("name", YOCO_CONFIGS)
def test_bounded_replay_mask_equals_compact_and_large_keep_equals_off(checkpoints, name) -> None:
    prompt = _ids(37, 20, 700)
    mask = _replay_logits(checkpoints[name], "mask", 12, prompt)
    compact = _replay_logits(checkpoints[name], "compact", 12, prompt)
    off = _replay_logits(checkpoints[name], "off", 140, prompt)
    wide = _replay_logits(checkpoints[name], "compact", len(prompt), prompt)
    for m, c, o, w in zip(mask, compact, off, wide):
        torch.testing.assert_close(m, c, atol=1e-5, rtol=0)
        torch.testing.assert_close(w, o, atol=1e-5, rtol=0)
    # truncation is active: the kept-suffix prefill is an approximation of the full one
    assert (mask[0] - off[0]).abs().max() > 1e-4


def test_bounded_replay_rejects_small_keep_and_dropped_rows(checkpoints) -> None:
    path = checkpoints["c1_yoco"]
    with pytest.raises(ValueError, match=r"keep=11 .*sliding_window \+ max_backtrack = 12"):
        load_runtime(path, options=RuntimeOptions(max_backtrack=4, replay_mode="compact", replay_keep=11))
    rt = load_runtime(path, options=RuntimeOptions(max_backtrack=4, replay_mode="compact", replay_keep=12))
    rt.allocate_cache(2, 2)
    with pytest.raises(ValueError, match="logits='all'"):
        rt.forward(ForwardBatch([SequenceSegment(1, [1], 0, list(range(3, 16)), logits="all")]))


def _print_deviation(
    capsys, label: str, ref: torch.Tensor, got: torch.Tensor, note: str = ""
) -> torch.Tensor:
    """Prints how far `got`'s logits are from `ref`'s (run with -s to see it); returns |got - ref|."""
    diff = (got - ref).abs()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    with capsys.disabled():
        print(
            f"\n[{label}] max |dlogit| {diff.max():.3g}, mean {diff.mean():.3g}, argmax agreement {agree:.1%}"
            + note
        )
    return diff


@pytest.mark.parametrize("name", ["c2", "full"])
def test_release_cache_precision_deviation_is_reported(checkpoints, name, capsys) -> None:
    exact = load_runtime(checkpoints[name], options=RuntimeOptions(max_backtrack=4))
    release = load_runtime(
        checkpoints[name], options=RuntimeOptions(max_backtrack=4, cache_precision="release")
    )
    prompt = _ids(60, 30, exact.vocab_size)
    ref, got = exact.score([prompt])[0], release.score([prompt], chunk=13)[0]
    _print_deviation(capsys, f"release vs exact cache, {name}", ref, got, f" (logit std {ref.std():.2f})")
    assert torch.isfinite(got).all()


def test_bfloat16_compute_tracks_float32(checkpoints, capsys) -> None:
    path = checkpoints["full"]
    ref = load_runtime(path).score([_ids(40, 31, 700)])[0]
    bf16 = load_runtime(path, dtype=torch.bfloat16)
    got = bf16.score([_ids(40, 31, 700)], chunk=9)[0]
    assert got.dtype == torch.float32 and bf16.model.blocks[0].moe.weights.experts.w1.dtype == torch.int8
    diff = _print_deviation(capsys, "bf16 vs fp32 compute, full", ref, got)
    assert diff.mean() < 0.1 * ref.std()
