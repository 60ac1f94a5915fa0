"""The batch-invariant GPU slice test's probe runs on the CPU (tiny config, a recorder that re-runs the
step standing in for a CUDA graph): which graph key each step of each scenario replays."""

from pathlib import Path

from deepinfer.models.deepseek_v41.metadata import FixedShape
from deepinfer.models.deepseek_v41.runtime import load_runtime
from deepinfer.testing import write_tiny_checkpoint
from deepinfer.testing.invariance import DECODE, PROBE_LEN, SCENARIOS, Scenario, allocate, run_probe
from deepinfer.testing.recorder import rerun_recorder


def _decode(num_seqs: int, table_width: int) -> FixedShape:
    return FixedShape(num_seqs, 1, table_width, "last")


def test_slice_scenarios_replay_their_bucket_at_every_one_token_step(tmp_path: Path) -> None:
    rt = load_runtime(write_tiny_checkpoint("swa_only", tmp_path, seed=0))
    rt.graph_recorder = rerun_recorder
    allocate(rt, 300 + DECODE + 1, 10)  # as the GPU test
    scenarios = {"alone": Scenario(), **SCENARIOS}
    got = {name: run_probe(rt, s, PROBE_LEN, DECODE).graphs for name, s in scenarios.items()}
    # prefills run eagerly, and so does the step a 260-token prefill joins; its 264 tokens take 3 blocks
    assert got == {
        "alone": [None, *[_decode(1, 2)] * DECODE],
        "3 seqs (bucket 4)": [None, *[_decode(4, 2)] * DECODE],
        "8 seqs, probe 4th (bucket 8)": [None, *[_decode(8, 2)] * DECODE],
        "prefill joins a decode step": [None, None, *[_decode(4, 4)] * (DECODE - 1)],
    }
    assert all([k is not None for k in got[n]] == s.decode_only(DECODE) for n, s in scenarios.items())
    # each larger bucket grew the graphs' shared output buffer, dropping the smaller width-2 graphs:
    # only two remain although four keys replayed
    assert set(rt.graphs.graphs) == {_decode(8, 2), _decode(4, 4)}
    assert run_probe(rt, SCENARIOS["3 seqs (bucket 4)"], PROBE_LEN, DECODE, graphs=False).graphs == [None] * 4
