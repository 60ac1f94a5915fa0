"""Starting ranks: one process per rank on this host (or ranks started by torchrun), and a watchdog.

`spawn(fn, n, *args)` runs `fn(state, *args)` in n fresh processes joined in one gloo group (the
torchrun environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and returns their results in rank
order. Fault behaviour: collectives time out after `timeout_s`; the launcher watches the processes,
and when one dies or raises it stops the others and raises `RankFailure` naming each failed rank and
why, and the ranks it had to stop, so a lost rank ends the whole group instead of leaving the others
waiting in a collective. A rank whose launcher disappears exits on its own.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm import tqdm

from deepinfer.distributed.state import ParallelState

DEFAULT_TIMEOUT_S = 300.0
_GRACE_S = 1.0  # after a first failure, how long other failures are collected before stopping the group
_STOPPED = "stopped while still running (hung, or waiting for a failed rank)"


class RankFailure(RuntimeError):
    """A rank died or raised; the message names every failed rank and its error."""


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S, redundant_experts: int = 0) -> ParallelState:
    """Join the gloo group described by the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(f"{var} is not set: start ranks with torchrun or deepinfer's --dp")
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    return ParallelState(dist.get_rank(), dist.get_world_size(), None, redundant_experts)


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = DEFAULT_TIMEOUT_S,
          redundant_experts: int = 0, threads: int | None = None) -> list[Any]:
    """Run `fn(state, *args)` on `world_size` new ranks -> their return values in rank order."""
    ctx = mp.get_context("spawn")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world_size)}
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    procs = [
        ctx.Process(target=_rank_main, name=f"deepinfer-rank{r}", daemon=True,
                    args=(fn, args, {**env, "RANK": str(r)}, timeout_s, redundant_experts, threads,
                          pipes[r][1]))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for _, sender in pipes:
        sender.close()  # the child holds the only sending end: a dead child reads as EOF
    readers = {reader: r for r, (reader, _) in enumerate(pipes)}
    done: dict[int, Any] = {}
    failures: dict[int, str] = {}
    first_failure: float | None = None
    try:
        while len(done) < world_size:
            for reader in wait(list(readers), timeout=0.1):
                r = readers.pop(reader)  # type: ignore[index]
                try:
                    ok, payload = reader.recv()  # type: ignore[union-attr]
                except EOFError:
                    continue  # died without a word: its exit code tells
                if ok:
                    done[r] = pickle.loads(payload)
                else:
                    failures[r] = payload
            for r, p in enumerate(procs):
                if r not in done and r not in failures and p.exitcode not in (None, 0):
                    failures[r] = f"process died ({_exit_reason(p.exitcode)})"
            if failures:
                first_failure = first_failure or time.monotonic()
                if time.monotonic() - first_failure > _GRACE_S:
                    break
    finally:
        for r, p in enumerate(procs):
            if p.is_alive():
                if failures and r not in failures:
                    failures[r] = _STOPPED
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        for reader, _ in pipes:
            reader.close()
    if failures:
        # ranks that died first: they are the cause, the others' errors are usually their consequence;
        # ranks still running last (hung, or waiting in a collective when the group was stopped)
        order = sorted(failures, key=lambda r: (failures[r] == _STOPPED,
                                                not failures[r].startswith("process died"), r))
        raise RankFailure("; ".join(f"rank {r}: {failures[r]}" for r in order))
    return [done[r] for r in range(world_size)]


def _rank_main(fn: Callable[..., Any], args: tuple, env: dict[str, str], timeout_s: float,
               redundant_experts: int, threads: int | None, result: Connection) -> None:
    os.environ.update(env)
    tqdm.set_lock(threading.RLock())  # its default, a multiprocessing semaphore, leaks when a rank ends
    if threads is not None:
        torch.set_num_threads(threads)
    _exit_with_parent()
    try:
        state = init_from_env(timeout_s, redundant_experts)
        payload = pickle.dumps(fn(state, *args))
    except BaseException as exc:  # reported to the launcher, which stops the group
        result.send((False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
        result.close()
        os._exit(1)
    result.send((True, payload))
    result.close()
    dist.destroy_process_group()


def _exit_with_parent() -> None:
    """A watchdog thread: end this rank when the launcher process is gone (no orphaned ranks)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(2)

    threading.Thread(target=watch, name="deepinfer-rank-watchdog", daemon=True).start()


def _exit_reason(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
