"""Confidence-scheduled verification against exhaustive search on small batches.

Confidences are multiples of 1/16 and latencies integers, so every sum is exact in float64 and the
scheduler's objective must equal the brute-force optimum exactly.
"""

import itertools

import pytest
import torch

from deepinfer.speculators.interface import SpeculatorConfig
from deepinfer_spec.confidence import (
    ConfidenceScheduler,
    cumulative_confidence,
    expected_tokens_per_ms,
    schedule_verification,
    split_fixed_total,
)


def _random_case(gen: torch.Generator, requests: int, drafts: int) -> tuple[torch.Tensor, torch.Tensor]:
    per_position = torch.randint(0, 17, (requests, drafts), generator=gen).double() / 16
    cum_conf = per_position.sort(dim=1, descending=True).values  # dyadic and nonincreasing
    step_ms = torch.randint(1, 40, (requests * (drafts + 1) + 1,), generator=gen).double()
    return cum_conf, step_ms


def _choices(requests: int, drafts: int, max_drafts: torch.Tensor | None):
    limits = [drafts if max_drafts is None else int(max_drafts[r]) for r in range(requests)]
    for choice in itertools.product(*(range(limit + 1) for limit in limits)):
        yield torch.tensor(choice)


def _brute_force_best(cum_conf, step_ms, max_drafts=None) -> float:
    requests, drafts = cum_conf.shape
    return max(expected_tokens_per_ms(cum_conf, k, step_ms) for k in _choices(requests, drafts, max_drafts))


@pytest.mark.parametrize("seed", range(40))
def test_schedule_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    requests, drafts = 1 + seed % 4, 1 + seed % 3
    cum_conf, step_ms = _random_case(gen, requests, drafts)
    max_drafts = torch.randint(0, drafts + 1, (requests,), generator=gen) if seed % 2 else None

    plan = schedule_verification(cum_conf, step_ms, max_drafts)

    assert expected_tokens_per_ms(cum_conf, plan.num_drafts, step_ms) == _brute_force_best(
        cum_conf, step_ms, max_drafts
    )
    assert plan.total_tokens == requests + int(plan.num_drafts.sum())
    assert plan.step_ms == float(step_ms[plan.total_tokens])
    assert plan.expected_tokens / plan.step_ms == expected_tokens_per_ms(cum_conf, plan.num_drafts, step_ms)
    if max_drafts is not None:
        assert (plan.num_drafts <= max_drafts.numpy()).all()


@pytest.mark.parametrize("seed", range(20))
def test_split_fixed_total_maximises_expected_tokens(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    requests, drafts = 1 + seed % 4, 1 + seed % 3
    cum_conf, _ = _random_case(gen, requests, drafts)
    max_drafts = torch.randint(0, drafts + 1, (requests,), generator=gen) if seed % 2 else None
    proposed = requests * drafts if max_drafts is None else int(max_drafts.sum())
    for total in range(requests, requests * (drafts + 1) + 1):
        split = split_fixed_total(cum_conf, total, max_drafts)
        assert int(split.sum()) == min(total - requests, proposed)
        best = max(
            float((cum_conf * (torch.arange(drafts) < k[:, None])).sum())
            for k in _choices(requests, drafts, max_drafts)
            if int(k.sum()) == min(total - requests, proposed)
        )
        assert float((cum_conf * (torch.arange(drafts) < split[:, None])).sum()) == best


def test_split_of_the_chosen_total_is_the_plan():
    gen = torch.Generator().manual_seed(7)
    cum_conf = cumulative_confidence(torch.rand(64, 5, generator=gen))
    step_ms = 10 + torch.arange(64 * 6 + 1, dtype=torch.float64) * 0.05
    plan = schedule_verification(cum_conf, step_ms)
    assert split_fixed_total(cum_conf, plan.total_tokens).tolist() == plan.num_drafts.tolist()
    assert 64 < plan.total_tokens < 64 * 6  # a real trade-off, not an edge


def _host_and_device_inputs(seed: int) -> tuple[ConfidenceScheduler, torch.Tensor, list[int]]:
    """A profiled scheduler, float32 conditional confidences [R, K] (NaN padding past each row's
    count, near-ties: repeated values and neighbours one float32 step apart) and the counts."""
    gen = torch.Generator().manual_seed(300 + seed)
    requests, drafts = 1 + seed % 6, 1 + seed % 5
    conf = torch.rand(requests, drafts, generator=gen)
    conf[:, 0] = conf[0, 0]  # equal first products across requests
    if requests > 1:
        conf[1] = torch.nextafter(conf[0], torch.tensor(2.0))  # one float32 step above request 0
    counts = torch.randint(0, drafts + 1, (requests,), generator=gen).tolist()
    conf[torch.arange(drafts) >= torch.tensor(counts)[:, None]] = float("nan")
    slope = float(torch.rand((), generator=gen)) * 0.3
    scheduler = ConfidenceScheduler()
    scheduler.profile(lambda tokens: 1.0 + slope * tokens, max_tokens=requests * (drafts + 1))
    return scheduler, conf, counts


@pytest.mark.parametrize("seed", range(30))
def test_device_split_of_the_host_total_is_the_host_choice(seed):
    # The asynchronous path: the host picks the total, the device splits it from the same confidences.
    scheduler, conf, counts = _host_and_device_inputs(seed)
    host = scheduler.choose_padded(conf, counts)
    total = len(counts) + int(host.sum())
    device = split_fixed_total(cumulative_confidence(conf), total, torch.tensor(counts))
    assert device.tolist() == host.tolist()


@pytest.mark.parametrize("seed", range(30))
def test_scheduler_split_of_the_chosen_total_is_its_choice(seed):
    # What the engine's runner applies: ConfidenceScheduler.split of `choose`'s total over the same
    # estimates (as lists, the engine's input to choose), padding past each count NaN on the device side.
    scheduler, conf, counts = _host_and_device_inputs(seed)
    rows = [conf[r, :n].tolist() for r, n in enumerate(counts)]
    host = scheduler.choose(rows)
    split = scheduler.split(conf, torch.tensor(counts), sum(host))
    assert split.dtype == torch.int64 and split.tolist() == host


def test_scheduler_split_of_a_smaller_total_gives_the_best_drafts():
    scheduler = ConfidenceScheduler()
    conf = torch.tensor([[0.9, 0.9, 0.2], [0.95, 0.1, float("nan")], [0.5, 0.99, 0.99]])
    # cumulative: [0.9, 0.81, 0.162], [0.95, 0.095], [0.5, 0.495, 0.49]; three drafts: 0.95, 0.9, 0.81
    assert scheduler.split(conf, torch.tensor([3, 2, 3]), 3).tolist() == [2, 1, 0]
    assert scheduler.split(conf, torch.tensor([1, 2, 3]), 3).tolist() == [1, 1, 1]


def test_device_split_ranks_float64_products_like_the_host():
    # In float32 the two second products tie (0.38350561); in float64 request 1's is the larger.
    conf = torch.tensor([[0.6808037757873535, 0.5633130073547363], [0.9559935331344604, 0.40115922689437866]])
    step_ms = torch.tensor([1.0] * 6 + [100.0])  # best total: 5 tokens, i.e. three of the four drafts
    host = schedule_verification(torch.cumprod(conf.double(), dim=1), step_ms)
    assert host.num_drafts.tolist() == [1, 2]
    assert split_fixed_total(cumulative_confidence(conf), host.total_tokens).tolist() == [1, 2]


def test_split_reads_no_values_on_the_host():
    # Meta tensors hold no data: any value read (a sync on a real device) would raise.
    conf, counts = torch.empty(8, 5, device="meta"), torch.empty(8, dtype=torch.int64, device="meta")
    split = split_fixed_total(cumulative_confidence(conf), 20, counts)
    assert split.shape == (8,) and split.dtype == torch.int64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_split_never_syncs_and_matches_the_host():
    scheduler, conf, counts = _host_and_device_inputs(29)
    host = scheduler.choose_padded(conf, counts)
    conf_d, counts_d = conf.cuda(), torch.tensor(counts).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        split = split_fixed_total(cumulative_confidence(conf_d), len(counts) + int(host.sum()), counts_d)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert split.cpu().tolist() == host.tolist()


def test_split_never_verifies_unproposed_drafts():
    cum_conf = torch.tensor([[0.9, 0.8, 0.7], [0.5, 0.4, 0.3]])
    split = split_fixed_total(cum_conf, 2 + 6, max_drafts=torch.tensor([1, 2]))
    assert split.tolist() == [1, 2]


def test_zero_confidence_verifies_nothing():
    step_ms = torch.ones(4 * 6 + 1)  # even a flat curve: a zero-value draft never helps
    plan = schedule_verification(torch.zeros(4, 5), step_ms)
    assert plan.num_drafts.tolist() == [0, 0, 0, 0]
    assert plan.total_tokens == 4


def test_flat_latency_verifies_every_proposed_draft():
    cum_conf = cumulative_confidence(torch.full((3, 5), 0.5))
    step_ms = torch.full((3 * 6 + 1,), 20.0)
    assert schedule_verification(cum_conf, step_ms).num_drafts.tolist() == [5, 5, 5]
    capped = schedule_verification(cum_conf, step_ms, max_drafts=torch.tensor([0, 2, 5]))
    assert capped.num_drafts.tolist() == [0, 2, 5]


def test_steep_latency_verifies_nothing():
    cum_conf = torch.full((2, 3), 0.99)
    step_ms = torch.tensor([1.0, 1.0, 1.0] + [100.0] * 6)
    assert schedule_verification(cum_conf, step_ms).num_drafts.tolist() == [0, 0]


def test_bucketed_latency_fills_the_bucket():
    # A padded step of 3 or 4 tokens costs the same: a low-value draft is free once the bucket is paid for.
    cum_conf = torch.tensor([[0.9, 0.05], [0.8, 0.02]])
    step_ms = torch.tensor([1.0, 1.0, 10.0, 16.0, 16.0, 30.0, 30.0])
    plan = schedule_verification(cum_conf, step_ms)
    assert plan.total_tokens == 4
    assert plan.num_drafts.tolist() == [1, 1]


def test_bad_inputs_are_named():
    step_ms = torch.ones(20)
    with pytest.raises(ValueError, match="nonincreasing"):
        schedule_verification(torch.tensor([[0.2, 0.9]]), step_ms)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        schedule_verification(torch.tensor([[1.5, 0.9]]), step_ms)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        schedule_verification(torch.tensor([[float("nan"), 0.0]]), step_ms)
    with pytest.raises(ValueError, match="step_ms"):
        schedule_verification(torch.zeros(4, 5), step_ms)
    with pytest.raises(ValueError, match=r"\[requests, drafts\]"):
        schedule_verification(torch.zeros(5), step_ms)
    with pytest.raises(ValueError, match="max_drafts"):
        schedule_verification(torch.zeros(2, 2), step_ms, max_drafts=torch.tensor([1]))
    with pytest.raises(ValueError, match="split_fixed_total"):
        schedule_verification(torch.zeros(2, 2, device="meta"), step_ms)
    with pytest.raises(ValueError, match="total_tokens"):
        split_fixed_total(torch.zeros(2, 2), 7)


def test_empty_batch():
    plan = schedule_verification(torch.zeros(0, 5), torch.ones(1))
    assert plan.total_tokens == 0 and plan.num_drafts.size == 0


def test_scheduler_verifies_everything_until_profiled():
    scheduler = ConfidenceScheduler(SpeculatorConfig(num_draft_tokens=3))
    assert scheduler.choose([[0.9, 0.1, 0.0], [], [0.5]]) == [3, 0, 1]
    scheduler.record(3, 7, 0.01)  # nothing to update yet


def test_scheduler_chooses_from_the_profiled_curve():
    scheduler = ConfidenceScheduler()
    # Each token costs 1 ms over a 10 ms step: verify draft j when its cumulative confidence beats the
    # batch's marginal rate. Profiled at sizes 1, 2, 4, 8, 9: exact for this linear cost.
    scheduler.profile(lambda tokens: 10.0 + tokens, max_tokens=9)
    assert scheduler.choose([[0.95, 0.9, 0.1], [0.2, 0.9], [0.9]]) == [2, 0, 1]
    assert scheduler.choose([[], []]) == [0, 0]


def test_scheduler_padded_input_ignores_padding():
    scheduler = ConfidenceScheduler()
    scheduler.profile(lambda tokens: 10.0 + tokens, max_tokens=9)
    padded = torch.tensor([[0.95, 0.9, 0.1], [0.2, 0.9, float("nan")], [0.9, 7.0, -1.0]])
    assert scheduler.choose_padded(padded, [3, 2, 1]).tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="one draft count per row"):
        scheduler.choose_padded(padded, [3, 2])


def test_scheduler_records_steps_into_the_curve():
    scheduler = ConfidenceScheduler()
    scheduler.profile(lambda tokens: 10.0 + tokens, max_tokens=8)
    scheduler.record(num_seqs=2, num_tokens=8, seconds=0.030)
    assert scheduler.curve.sizes.tolist() == [1, 2, 4, 8] and not scheduler.curve.padded
    assert scheduler.curve.predict(8) > 18.0
    with pytest.raises(ValueError, match="at least one token per sequence"):
        scheduler.record(num_seqs=4, num_tokens=3, seconds=0.01)


def test_scheduler_profiles_graph_buckets():
    timed: list[int] = []

    def time_step(tokens: int) -> float:
        timed.append(tokens)
        return 10.0 + tokens

    scheduler = ConfidenceScheduler()
    scheduler.profile(time_step, 24, sizes=[8, 16, 24], padded=True)
    assert sorted(set(timed)) == [8, 16, 24]
    assert scheduler.curve.predict(9) == 26.0
