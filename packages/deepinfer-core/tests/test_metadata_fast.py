"""The step metadata build stays bitwise identical to the recorded output of the list-based builder.

fixtures/step_metadata.json holds, per step, a digest over every tensor (dtype, shape, bytes) and every
host value of the StepMetadata that the builder of commit 5b88a6b (before the incremental, fixed-plan
builder) produced for the scenarios below: eager prefill, mixed, decode and verification steps, fixed shapes
with padding, bounded replay, Engram, several compress ratios, block tables that grow between steps
and slots handed to new sequences (re-recorded when RowSet.visible was added, every earlier field's digest
checked unchanged first). Regenerate only for an intended change of the metadata:
`python packages/deepinfer-core/tests/test_metadata_fast.py`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.models.deepseek_v41 import metadata
from deepinfer.models.deepseek_v41.metadata import (
    BoundedReplay,
    FixedShape,
    MetadataBuilder,
    Staging,
    StepGeometry,
    StepMetadata,
)
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing.fields import fields_by_path

FIXTURE = Path(__file__).parent / "fixtures" / "step_metadata.json"

GEOMETRIES = {
    # Flash slice: window 128, DSpark backtrack 6, ratios 1 and 2, Engram 4-grams
    "flash": StepGeometry(128, 134, 9, {2: 7}, (1, 2), BoundedReplay(), 4, 9),
    "mask": StepGeometry(128, 134, 9, {2: 7, 4: 9}, (1, 2, 4), BoundedReplay("mask", 140)),
    "compact": StepGeometry(128, 134, 9, {2: 7}, (2,), BoundedReplay("compact", 140), 3, 6),
    "small": StepGeometry(4, 6, 9, {4: 6}, (1, 4), BoundedReplay(), 2, 3),
}

Step = tuple[str, ForwardBatch, bool, FixedShape | None, str]  # label, batch, last consumer, shape, staging


def _seg(slot: int, table: list[int], start: int, n: int, logits: str = "last") -> SequenceSegment:
    return SequenceSegment(slot, table, start, [(7 * start + 3 * j + slot) % 1000 for j in range(n)], logits)  # type: ignore[arg-type]


def _fixed(segs: list[SequenceSegment], num_seqs: int, n: int, logits: str = "last") -> FixedShape:
    width = 1 << max(max((len(s.block_table) for s in segs), default=1) - 1, 0).bit_length()
    return FixedShape(num_seqs, n, width, logits)  # type: ignore[arg-type]


def scenarios(geo: StepGeometry) -> Iterator[Step]:
    """Steps run in order on one builder; tables are mutated between steps as the engine does
    (appended to, or replaced by a new list when a slot gets a new sequence)."""
    nmax = geo.max_fixed_tokens
    t1, t2, t3 = [3], [5, 6], [9]
    segs = [_seg(1, t1, 0, 100), _seg(2, t2, 0, 200, "all"), _seg(3, t3, 0, 7, "none")]
    yield "prefill", ForwardBatch(segs), False, None, "own"
    segs = [_seg(1, t1, 100, 27), _seg(2, t2, 200, 1), _seg(3, t3, 7, 30, "all")]
    yield "chunk", ForwardBatch(segs), True, None, "own"
    t1.append(4)
    segs = [_seg(1, t1, 127, 1), _seg(2, t2, 201, 4, "all"), _seg(3, t3, 37, 1)]
    yield "cross-block", ForwardBatch(segs), False, None, "own"
    for i, pos in enumerate((128, 129, 130, 131, 200, 255)):
        segs = [_seg(1, t1, pos, 1), _seg(3, t3, 38 + i, 1, "all" if pos == 200 else "last")]
        yield f"decode-{pos}", ForwardBatch(segs), False, _fixed(segs, 2, 1), "graph"
        yield f"decode-eager-{pos}", ForwardBatch(segs), True, None, "own"
    t1.append(8)
    t3.append(11)
    for n in range(1, nmax + 1):
        for logits in ("last", "all"):
            segs = [_seg(1, t1, 256 - n // 2, n, logits), _seg(2, t2, 202, n, logits),
                    _seg(3, t3, 127, n, logits)]
            yield f"verify-{n}-{logits}", ForwardBatch(segs), True, _fixed(segs, 4, n, logits), "graph"
            yield f"verify-eager-{n}-{logits}", ForwardBatch(segs), False, None, "own"
    t2 = [12]  # slot 2 handed to a new sequence: a new, shorter list
    segs = [_seg(2, t2, 0, 3), _seg(1, t1, 300, 1)]
    yield "new-seq", ForwardBatch(segs), False, None, "own"
    segs = [_seg(2, t2, 3, 1), _seg(1, t1, 301, 1)]
    yield "new-seq-fixed", ForwardBatch(segs), False, _fixed(segs, 2, 1), "graph"
    yield "pads-only", ForwardBatch([]), False, FixedShape(8, 1, 4, "last"), "graph"
    yield "pads-only-verify", ForwardBatch([]), True, FixedShape(4, nmax, 2, "all"), "graph"
    segs = [_seg(s, [20 + s, 30 + s, 40 + s], 2 + 41 * s, 1) for s in range(1, 9)]
    yield "full-batch", ForwardBatch(segs), False, _fixed(segs, 8, 1), "builder"
    yield "wide-table", ForwardBatch(segs), False, FixedShape(16, 1, 8, "last"), "builder"
    segs = [_seg(s, [20 + s], 0, 2, "all") for s in range(1, 5)]
    yield "start-zero", ForwardBatch(segs), True, _fixed(segs, 4, 2, "all"), "graph"


def _tensor_digest(t: torch.Tensor) -> str:
    a = np.ascontiguousarray(t.cpu().numpy())
    return f"{a.dtype} {list(a.shape)} {hashlib.sha256(a.tobytes()).hexdigest()}"


def digest(meta: StepMetadata) -> dict[str, object]:
    """Every tensor (dtype, shape, sha256 of its bytes) and host value of the metadata, by field path."""
    return fields_by_path(meta, _tensor_digest)


def run(geo: StepGeometry) -> dict[str, str]:
    builder = MetadataBuilder(geo, "cpu")
    stagings: dict[FixedShape, Staging] = {}
    results = {}
    for label, batch, last, shape, where in scenarios(geo):
        staging = None
        if where == "graph":  # as graphs.py: one persistent staging per shape
            assert shape is not None
            staging = stagings.setdefault(shape, Staging(torch.device("cpu"), persistent=True))
        fields = json.dumps(digest(builder.build(batch, last, shape, staging)), sort_keys=True)
        results[label] = hashlib.sha256(fields.encode()).hexdigest()[:32]
    return results


def record() -> None:
    FIXTURE.write_text(json.dumps({name: run(geo) for name, geo in GEOMETRIES.items()}, indent=1) + "\n")


@pytest.mark.parametrize("device_window", [False, True])
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_metadata_matches_recorded_builds(name: str, device_window: bool, monkeypatch) -> None:
    """`device_window`: every eager build takes the long-step path (window broadcast on the device)."""
    if device_window:
        monkeypatch.setattr(metadata, "DEVICE_WINDOW_KEYS", 0)
    expected = json.loads(FIXTURE.read_text())[name]
    got = run(GEOMETRIES[name])
    assert list(got) == list(expected)
    assert [label for label in expected if got[label] != expected[label]] == []


if __name__ == "__main__":
    record()


def _table_of(meta: StepMetadata, i: int) -> list[int]:
    return meta.block_tables[i].tolist()


def test_block_tables_follow_appends_and_replaced_lists() -> None:
    geo = GEOMETRIES["flash"]
    builder = MetadataBuilder(geo, "cpu")
    table = list(range(1, 101))  # wider than the slot tables' first allocation
    last = 100 * BLOCK_TOKENS - 1
    meta = builder.build(ForwardBatch([_seg(1, table, last, 1)]), False)
    assert _table_of(meta, 0) == table + [0] * 28
    table.append(500)  # the engine appends to the same list
    shape = FixedShape(2, 1, 128, "last")
    meta = builder.build(ForwardBatch([_seg(1, table, last + 1, 1)]), False, shape)
    assert _table_of(meta, 0) == table + [0] * 27 and _table_of(meta, 1) == [0] * 128
    assert meta.compression[1].pool_dest.tolist() == [500 * BLOCK_TOKENS, 0]
    fresh = [7, 8]  # the slot goes to a new sequence: a new, shorter list
    meta = builder.build(ForwardBatch([_seg(1, fresh, 130, 1)]), False, FixedShape(2, 1, 2, "last"))
    assert _table_of(meta, 0) == [7, 8]
    meta = builder.build(ForwardBatch([_seg(1, fresh, 131, 1)]), False)
    assert _table_of(meta, 0) == [7, 8] and builder.tables.rows[1, 2:].tolist() == [0] * 126
    with pytest.raises(ValueError, match=r"block tables of slots \[1\] do not cover"):
        builder.build(ForwardBatch([_seg(1, fresh, 2 * BLOCK_TOKENS, 1)]), False, FixedShape(1, 1, 2, "last"))


def test_fixed_builds_reuse_one_metadata_per_buffer() -> None:
    """A graph's staging gets the same StepMetadata (same addresses) every step, with new values."""
    builder = MetadataBuilder(GEOMETRIES["flash"], "cpu")
    staging = Staging(torch.device("cpu"), persistent=True)
    shape = FixedShape(4, 1, 2, "last")
    table = [3, 4]
    first = builder.build(ForwardBatch([_seg(2, table, 10, 1)]), False, shape, staging)
    ptr = first.all_rows.window.data_ptr()
    second = builder.build(ForwardBatch([_seg(2, table, 11, 1), _seg(1, [5], 0, 1)]), False, shape, staging)
    assert second is first and second.all_rows.window.data_ptr() == ptr
    assert second.seg_start.tolist() == [11, 0, 0, 0] and second.slots.tolist() == [2, 1, 0, 0]


def test_plans_sharing_a_buffer_rewrite_their_constants() -> None:
    """Shapes that alternate on one staging buffer, with eager builds in between, build what a fresh
    builder builds for each step alone."""
    geo = GEOMETRIES["mask"]
    shared = MetadataBuilder(geo, "cpu")
    tables = {s: [10 * s, 10 * s + 1] for s in range(1, 5)}
    for step in range(6):
        n = (1, 3, 2)[step % 3]
        segs = [_seg(s, tables[s], 100 + 7 * s + step, n, "all") for s in range(1, 2 + step % 3)]
        shape = _fixed(segs, 4, n, "all")
        got = digest(shared.build(ForwardBatch(segs), True, shape))
        assert got == digest(MetadataBuilder(geo, "cpu").build(ForwardBatch(segs), True, shape))
        shared.build(ForwardBatch(segs), False)


def test_fixed_shape_errors_name_the_problem() -> None:
    builder = MetadataBuilder(GEOMETRIES["small"], "cpu")
    seg = _seg(1, [2], 5, 2)
    with pytest.raises(ValueError, match="2 sequences do not fit a fixed shape of 1"):
        builder.build(ForwardBatch([seg, _seg(2, [3], 5, 2)]), False, FixedShape(1, 2, 1, "last"))
    with pytest.raises(ValueError, match="at most 3 tokens per sequence, got 4"):
        builder.build(ForwardBatch([seg]), False, FixedShape(1, 4, 1, "last"))
    with pytest.raises(ValueError, match="'last' or 'all' logits rows, got 'none'"):
        builder.build(ForwardBatch([seg]), False, FixedShape(1, 2, 1, "none"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not fit the fixed shape"):
        builder.build(ForwardBatch([seg]), False, FixedShape(1, 2, 1, "all"))
    with pytest.raises(ValueError, match="has no tokens"):
        builder.build(ForwardBatch([_seg(1, [2], 5, 0)]), False, FixedShape(1, 2, 1, "last"))
    with pytest.raises(ValueError, match=r"slots must lie in \[1, 9\)"):
        builder.build(ForwardBatch([_seg(9, [2], 5, 2)]), False, FixedShape(1, 2, 1, "last"))


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_visible_counts_are_complete_groups_up_to_each_row(name: str) -> None:
    geo = GEOMETRIES[name]
    builder = MetadataBuilder(geo, "cpu")
    for label, batch, last, shape, _ in scenarios(geo):
        meta = builder.build(batch, last, shape)
        for rows in (meta.all_rows, meta.consumer_rows):
            assert sorted(rows.visible) == sorted(geo.ratios)
            for r, visible in rows.visible.items():
                assert torch.equal(visible, (rows.positions + 1) // r), (label, r)
