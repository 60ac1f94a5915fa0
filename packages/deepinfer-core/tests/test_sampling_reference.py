"""The batched sampling ops against the sampler's saved outputs from before they existed (random
batches mixing every setting, fixtures/sampling_reference.json), and their device-path properties
(one metadata copy, no host reads before the tokens exist).

Regenerate the fixture only from a sampler known to be right:
    python packages/deepinfer-core/tests/test_sampling_reference.py > \
        packages/deepinfer-core/tests/fixtures/sampling_reference.json
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from deepinfer.ops import get_ops
from deepinfer.sampling import Sampler, SampleRow
from deepinfer.sampling.sampler import copy_to_device, sampling_metadata
from deepinfer.testing.conformance.sampling import EOS, random_batch

FIXTURE = Path(__file__).parent / "fixtures" / "sampling_reference.json"
BATCH_SIZES = (1, 5, 24, 40)


def outputs(sampler: Sampler, logits: torch.Tensor, rows: list[SampleRow]) -> dict:
    out = sampler(logits, rows)
    lps = [None if lp is None else [lp.token_id, lp.logprob, [list(t) for t in lp.top]]
           for lp in out.logprobs]
    return {"tokens": out.token_ids, "logprobs": lps}


def all_outputs() -> list[dict]:
    sampler = Sampler(EOS)
    return [outputs(sampler, *random_batch(seed, size)) for seed, size in enumerate(BATCH_SIZES)]


def test_outputs_equal_the_saved_per_row_sampler_bitwise():
    saved = json.loads(FIXTURE.read_text())
    assert [len(b["tokens"]) for b in saved] == list(BATCH_SIZES)
    assert all_outputs() == saved


def test_rows_sampled_alone_equal_their_batch():
    logits, rows = random_batch(11, 24)
    s = Sampler(EOS)
    batch = s(logits, rows).token_ids
    assert [s(logits[i : i + 1], [rows[i]]).token_ids[0] for i in range(24)] == batch


def test_metadata_moves_in_one_aligned_buffer():
    parts = [np.array([1, -2**63], dtype=np.int64), np.array([0.5, -1.25, 3.0], dtype=np.float32),
             np.array([True, False, True]), np.array([], dtype=np.int64), np.array([7], dtype=np.int64),
             np.arange(6, dtype=np.float32).reshape(2, 3)]
    out = copy_to_device(parts, torch.device("cpu"))
    assert [torch.equal(a, torch.from_numpy(b)) for a, b in zip(out, parts)] == [True] * 6
    assert len({t.untyped_storage().data_ptr() for t in out}) == 1  # views of one transfer
    assert all(t.data_ptr() % 8 == 0 for t in out)


def test_sampling_ops_read_no_device_values():
    # meta tensors have no values: a host read (.item(), .tolist(), value-dependent shapes) raises
    logits, rows = random_batch(3, 24)
    ops = get_ops("reference")
    meta, logprob_rows = sampling_metadata(rows, logits.shape[-1], EOS, torch.device("meta"))
    assert meta.any_drawn and meta.any_filtered and meta.any_adjusted
    tokens = ops.sample_tokens(ops.apply_penalties(logits.to("meta"), meta), meta)
    assert tokens.shape == (24,) and tokens.dtype == torch.int64
    chosen, top_v, top_i = ops.compute_logprobs(logits.to("meta"), tokens, logprob_rows, 5)
    assert chosen.shape == logprob_rows.shape and top_v.shape == top_i.shape == (logprob_rows.shape[0], 5)


if __name__ == "__main__":
    print(json.dumps(all_outputs()))
