"""The step-latency curve on synthetic step timings."""

import numpy as np
import pytest

from deepinfer_spec.latency import LatencyCurve, default_profile_sizes


def test_default_profile_sizes():
    assert default_profile_sizes(1) == [1]
    assert default_profile_sizes(8) == [1, 2, 4, 8]
    assert default_profile_sizes(30) == [1, 2, 4, 8, 16, 30]


def test_profile_takes_the_trimmed_mean_after_warmup():
    calls: list[int] = []
    # warmup, 5 repeats at size 4; warmup, 5 repeats at size 16
    noise = iter([999.0, 1.0, 50.0, 2.0, 3.0, 4.0, 999.0, 10.0, 11.0, 12.0, 13.0, 0.1])

    def time_step(total_tokens: int) -> float:
        calls.append(total_tokens)
        return next(noise)

    curve = LatencyCurve.profile(time_step, [4, 16], warmup=1, repeats=5)
    assert calls == [4] * 6 + [16] * 6
    np.testing.assert_allclose(curve.step_ms, [3.0, 11.0])  # slowest and fastest dropped, warmup ignored


def test_linear_interpolation_and_extrapolation():
    curve = LatencyCurve([1, 5, 9], [10.0, 14.0, 22.0])
    assert curve.predict(1) == 10.0
    assert curve.predict(3) == 12.0
    assert curve.predict(7) == 18.0
    assert curve.predict(11) == 26.0  # the last segment's slope continues
    table = curve.table(12)
    assert table.dtype == np.float64 and table.shape == (13,)
    assert table[0] == 10.0 and table[3] == 12.0 and table[12] == 28.0


def test_padded_curve_costs_the_whole_bucket():
    curve = LatencyCurve([1, 2, 4, 8], [5.0, 6.0, 7.0, 9.0], padded=True)
    assert [curve.predict(t) for t in range(1, 9)] == [5.0, 6.0, 7.0, 7.0, 9.0, 9.0, 9.0, 9.0]
    assert curve.predict(10) == 10.0  # past the largest graph: the last segment's slope


def test_predictions_are_monotone():
    curve = LatencyCurve([1, 2, 4, 8], [5.0, 8.0, 6.0, 9.0])  # a noisy profile dips at 4
    np.testing.assert_allclose(curve.step_ms, [5.0, 8.0, 8.0, 9.0])
    assert (np.diff(curve.table(16)) >= 0).all()


def test_observe_at_a_size_is_a_moving_average():
    curve = LatencyCurve([1, 8], [10.0, 20.0], ema=0.25)
    curve.observe(8, 40.0)
    assert curve.predict(8) == 25.0
    curve.observe(8, 40.0)
    assert curve.predict(8) == 28.75
    assert curve.predict(1) == 10.0


def test_observe_between_sizes_moves_both_neighbours():
    curve = LatencyCurve([2, 6], [10.0, 20.0], ema=1.0)
    curve.observe(3, 20.0)  # predicted 12.5: the error 7.5 splits 3:1 between the sizes
    np.testing.assert_allclose(curve.step_ms, [10.0 + 0.75 * 7.5, 20.0 + 0.25 * 7.5])


def test_tracks_a_slowly_growing_context():
    # True cost: 10 ms + 0.5 ms per token, plus 0.01 ms per token per step of context growth.
    sizes = default_profile_sizes(64)
    curve = LatencyCurve.profile(lambda t: 10.0 + 0.5 * t, sizes, warmup=0, repeats=1)
    rng = np.random.default_rng(0)
    for step in range(2000):
        total = int(rng.integers(1, 65))
        curve.observe(total, 10.0 + (0.5 + 0.01 * step / 100) * total)
    truth = [10.0 + (0.5 + 0.01 * 20) * t for t in sizes]
    np.testing.assert_allclose(curve.step_ms, truth, rtol=0.05)
    # The profile alone would be off by up to 20% at the largest size.
    assert curve.predict(64) > 1.15 * (10.0 + 0.5 * 64)


def test_table_is_refreshed_after_observe():
    curve = LatencyCurve([1, 4], [1.0, 4.0], ema=1.0)
    before = curve.table(4).copy()
    curve.observe(4, 8.0)
    assert curve.table(4)[4] == 8.0 and before[4] == 4.0


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="strictly increasing"):
        LatencyCurve([1, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="equal length"):
        LatencyCurve([1, 2], [1.0])
    with pytest.raises(ValueError, match=r"step_ms\[1\]"):
        LatencyCurve([1, 2], [1.0, float("nan")])
    with pytest.raises(ValueError, match="ema"):
        LatencyCurve([1], [1.0], ema=0.0)
    curve = LatencyCurve([1], [1.0])
    with pytest.raises(ValueError, match="observed step time"):
        curve.observe(1, -3.0)
    with pytest.raises(ValueError, match="total_tokens"):
        curve.observe(0, 3.0)
    with pytest.raises(ValueError, match="max_tokens"):
        default_profile_sizes(0)
