"""Fault behaviour of a rank group: a rank that dies, or hangs, ends the whole group with an error that
names it, within the collective timeout (no rank is left waiting)."""

from __future__ import annotations

import textwrap
import time

import pytest

from deepinfer.distributed.launch import RankFailure, spawn

# rank functions must be importable by the spawned ranks: a module on PYTHONPATH
RANKS = textwrap.dedent('''
    import os, signal, time
    from pathlib import Path
    import torch
    import torch.distributed as dist

    def victim(state, marker, how):
        if state.rank == 1:
            Path(marker).write_text(str(time.time()))
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)  # hangs: never joins the collective
        dist.all_reduce(torch.ones(1))
''')


@pytest.fixture
def ranks_module(tmp_path, monkeypatch):
    (tmp_path / "fault_ranks.py").write_text(RANKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    import fault_ranks

    return fault_ranks


@pytest.mark.parametrize("how, cause", [("kill", "rank 1: process died (killed by SIGKILL)"),
                                        ("hang", "rank 0: ")])
def test_a_lost_rank_ends_the_group_within_the_timeout(ranks_module, tmp_path, how, cause):
    marker, timeout = tmp_path / "marker", 5.0
    with pytest.raises(RankFailure) as err:
        spawn(ranks_module.victim, 2, str(marker), how, timeout_s=timeout, threads=1)
    elapsed = time.time() - float(marker.read_text())
    assert str(err.value).startswith(cause)
    if how == "hang":  # the hung rank raised nothing: it is named as stopped
        assert str(err.value).endswith("rank 1: stopped while still running (hung, or waiting for a failed "
                                       "rank)")
    assert elapsed < timeout + 5  # the timeout, the launcher's grace second and some slack
