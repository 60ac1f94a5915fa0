"""Two ranks on the CPU (gloo): expert parallelism + row-sharded Engram + attention data parallelism
against the single-process model, with uneven prompt counts (one rank runs dummy forwards while the
other still works), an EPLB rebalance over redundant expert slots, and `generate --dp 2 --ep 2`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepinfer.distributed.frontend import score_rank
from deepinfer.distributed.launch import free_port, spawn
from deepinfer.distributed.placement import imbalance
from deepinfer.engine.loader import load_model
from deepinfer.entrypoints.cli.main import main
from deepinfer.entrypoints.llm import LLM
from deepinfer.sampling import SamplingParams
from deepinfer.testing import write_tiny_checkpoint

PROMPTS = [list(range(3, 40)), [7, 8, 9, 10] * 12, list(range(5, 60, 2)), list(range(20, 31))]
SHARES = [PROMPTS[:3], PROMPTS[3:]]  # rank 1 idles (dummy forwards) while rank 0 scores two more


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(write_tiny_checkpoint("engram", tmp_path_factory.mktemp("dist") / "engram", seed=5))


@pytest.fixture(scope="module")
def single(checkpoint) -> list[torch.Tensor]:
    torch.set_num_threads(1)
    return load_model(checkpoint).score(PROMPTS)


@pytest.fixture(scope="module")
def two_ranks(checkpoint):
    """Score, rebalance the experts from the measured loads (2 redundant slots), score again."""
    return spawn(score_rank, 2, checkpoint, SHARES, {}, 1, timeout_s=120, redundant_experts=2, threads=1)


def test_logits_equal_the_single_process_run(single, two_ranks):
    for round_ in range(2):
        got = two_ranks[0][0][round_] + two_ranks[1][0][round_]
        assert len(got) == len(PROMPTS)
        for ref, out in zip(single, got):
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_idle_rank_joins_every_exchange_with_dummy_forwards(two_ranks):
    (_, busy), (_, idle) = two_ranks
    assert busy["ticks"] == idle["ticks"] == 2 * 4  # two rounds of 3 forwards + one final idle tick
    assert busy["dummy_forwards"] == 0 and idle["dummy_forwards"] == 2 * 2
    assert busy["moe_layers"] == idle["moe_layers"] == 3


def test_eplb_rebalance_lowers_the_measured_imbalance(two_ranks):
    (_, r0), (_, r1) = two_ranks
    assert r0["rebalances"] == r1["rebalances"] and len(r0["rebalances"]) == 1
    planned = r0["rebalances"][0]
    assert all(after <= before for before, after in planned)
    # pairs each rank's experts computed, per layer, in the round before and after the rebalance
    measured = [[imbalance(torch.tensor(loads)) for loads in zip(a, b)]
                for a, b in zip(r0["pairs_received"], r1["pairs_received"])]
    assert sum(measured[1]) < sum(measured[0])


def test_moe_traffic_is_at_most_every_pair_both_ways(two_ranks):
    hidden, topk = 128, 2
    per_pair = 2 * hidden * 4 + 12  # the row out and its output back in float32, weight, slot and row
    sent = sum(report["moe_bytes_sent"] for _, report in two_ranks)
    pairs = sum(report["moe_tokens"] for _, report in two_ranks) * topk  # tokens summed over layers
    assert 0 < sent <= pairs * per_pair  # only pairs whose expert lives on the other rank travel


def test_cli_generate_on_two_ranks_matches_one_engine(checkpoint, capsys):
    """`deepinfer generate --dp 2 --ep 2`: 5 requests of uneven lengths spread least-loaded over the
    ranks (so one rank finishes first and idles), EPLB rebalancing every 3 forwards over 2 redundant
    slots while they run, outputs in request order, greedy tokens identical."""
    prompts = [p[:n] for p, n in zip(PROMPTS + PROMPTS[:1], (30, 12, 7, 9, 21))]
    argv = ["--log-level", "WARNING", "generate", "--model", checkpoint, "--dp", "2", "--ep", "2",
            "--dist-timeout", "120", "--redundant-experts", "2", "--eplb-interval", "3",
            "--temperature", "0", "--max-tokens", "6", "--ignore-eos", "--json"]
    for p in prompts:
        argv += ["--prompt-ids", ",".join(map(str, p))]
    assert main(argv) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    llm = LLM(checkpoint, device="cpu")
    ref = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    llm.close()
    assert [r["request_id"] for r in got] == [o.request_id for o in ref]
    assert [r["outputs"][0]["token_ids"] for r in got] == [o.outputs[0].token_ids for o in ref]


@pytest.mark.slow
def test_four_ranks_match_the_single_process_run(checkpoint, single):
    shares = [PROMPTS[:1], [], PROMPTS[1:3], PROMPTS[3:]]  # one rank gets nothing at all
    ranks = spawn(score_rank, 4, checkpoint, shares, {}, 1, timeout_s=300, redundant_experts=4, threads=1)
    for round_ in range(2):
        got = [t for rounds, _ in ranks for t in rounds[round_]]
        for ref, out in zip(single, got, strict=True):
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    assert ranks[1][1]["dummy_forwards"] == ranks[1][1]["ticks"] - 2  # idle in every round


@pytest.mark.slow
def test_generate_under_torchrun_prints_one_engines_outputs_once(checkpoint, tmp_path):
    """`torchrun --nproc-per-node 2 ... generate --dp 2`: each process is a rank, rank 0 prints all."""
    prompts = [[5, 6, 7, 8], [9, 10], [1, 2, 3]]
    argv = ["generate", "--model", checkpoint, "--dp", "2", "--temperature", "0", "--max-tokens", "4",
            "--ignore-eos", "--json"] + [a for p in prompts for a in ("--prompt-ids", ",".join(map(str, p)))]
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
               "deepinfer.entrypoints.cli.main", "--log-level", "WARNING", *argv]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    got = [json.loads(line) for line in run.stdout.splitlines()]
    llm = LLM(checkpoint, device="cpu")
    ref = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
        temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    llm.close()
    assert [r["outputs"][0]["token_ids"] for r in got] == [o.outputs[0].token_ids for o in ref]


def test_cli_rejects_ep_other_than_dp(checkpoint):
    assert main(["generate", "--model", checkpoint, "--prompt-ids", "1,2", "--dp", "2", "--ep", "4"]) == 2
