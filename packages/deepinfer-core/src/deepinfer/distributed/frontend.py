"""Attention data parallelism front end: spread requests over ranks, run them in step, gather outputs.

Each rank is a whole engine over its share of the model (experts, Engram rows) serving its own
requests; the front end assigns each request to the rank with the fewest queued tokens (prompt plus
max_tokens of what it already holds), gives requests without a seed the seed a single engine would
have drawn for them (so sampled outputs do not depend on the rank count), and returns the outputs in
request order under the ids a single engine would have used.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from deepinfer.distributed.eplb import rebalance
from deepinfer.distributed.launch import DEFAULT_TIMEOUT_S, init_from_env, spawn
from deepinfer.distributed.lockstep import LockStep
from deepinfer.distributed.state import ParallelState, use_parallel
from deepinfer.engine import RequestOutput
from deepinfer.engine.loader import TextTokenizer
from deepinfer.sampling import SamplingParams

Prompt = str | list[int]


def assign_least_loaded(costs: Sequence[int], world_size: int) -> list[int]:
    """Rank of each request, in order: the rank with the fewest queued tokens so far (ties: lowest)."""
    queued = [0] * world_size
    ranks = []
    for cost in costs:
        r = min(range(world_size), key=lambda i: (queued[i], i))
        queued[r] += cost
        ranks.append(r)
    return ranks


@dataclass
class DataParallelLLM:
    """`LLM.generate` over `dp` ranks of one host (expert parallel over the same ranks).

    Ranks are started for each `generate` call and load their share of the checkpoint (under torchrun,
    with RANK set, this process is one of them and rank 0 returns all outputs); `llm_kwargs`
    are `LLM(...)` arguments (engine and runtime settings) applied on every rank. `eplb_interval`
    rebalances the experts every that many forwards (0: off), over `redundant_experts` extra slots.
    """

    model: str | Path
    dp: int
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    redundant_experts: int = 0
    eplb_interval: int = 0
    seed: int = 0  # as EngineConfig.seed: seeds requests that give none
    threads: int | None = None  # torch threads per rank (default: torch's)

    def generate(self, prompts: Prompt | Sequence[Prompt] | None = None,
                 sampling_params: SamplingParams | dict | Sequence[SamplingParams | dict] | None = None,
                 prompt_token_ids: Sequence[list[int]] | None = None, use_tqdm: bool = False
                 ) -> list[RequestOutput]:
        """Complete every prompt; one output per prompt, in submission order (`use_tqdm` is accepted
        for `LLM.generate` compatibility; ranks show no progress bar)."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass exactly one of prompts and prompt_token_ids")
        items: list[Prompt] = (list(prompt_token_ids) if prompt_token_ids is not None
                               else [prompts] if isinstance(prompts, str) else list(prompts))  # type: ignore
        params = self._params(sampling_params, len(items))
        lengths = self._lengths(items)
        ranks = assign_least_loaded([n + (p.max_tokens or 0) for n, p in zip(lengths, params)], self.dp)
        shares = [[i for i, r in enumerate(ranks) if r == rank] for rank in range(self.dp)]
        work = [([items[i] for i in share], [params[i] for i in share]) for share in shares]
        args = (str(self.model), self.llm_kwargs, work, self.eplb_interval)
        if "RANK" in os.environ:  # started by torchrun: this process is one of the ranks
            results = self._as_rank(args)
            if results is None:
                return []  # rank 0 returns everyone's outputs
        else:
            results = spawn(_generate_rank, self.dp, *args, timeout_s=self.timeout_s,
                            redundant_experts=self.redundant_experts, threads=self.threads)
        outputs: list[RequestOutput | None] = [None] * len(items)
        for share, (outs, _) in zip(shares, results):
            for i, out in zip(share, outs):
                out.request_id = f"req-{i}"
                outputs[i] = out
        return outputs  # type: ignore[return-value]

    def _as_rank(self, args: tuple) -> list[Any] | None:
        """Run this process's share in the torchrun group; on rank 0, every rank's results."""
        if not dist.is_initialized():
            init_from_env(self.timeout_s)
        state = ParallelState(dist.get_rank(), dist.get_world_size(), None, self.redundant_experts)
        if state.world_size != self.dp:
            raise ValueError(f"dp={self.dp}, but torchrun started {state.world_size} ranks")
        result = _generate_rank(state, *args)
        gathered: list[Any] | None = [None] * state.world_size if state.rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        return gathered

    def close(self) -> None:
        """Nothing held between calls (ranks live for one `generate`)."""

    def _params(self, sampling_params: Any, n: int) -> list[SamplingParams]:
        if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
            if len(sampling_params) != n:
                raise ValueError(f"{len(sampling_params)} sampling params for {n} prompts")
            given = list(sampling_params)
        else:
            given = [sampling_params] * n
        seeds = random.Random(self.seed)
        params = []
        for p in given:
            p = p if isinstance(p, SamplingParams) else SamplingParams.model_validate(p or {})
            if p.seed is None:  # the draw a single engine makes for it, in arrival order
                p = p.model_copy(update={"seed": seeds.getrandbits(64)})
            params.append(p)
        return params

    def _lengths(self, items: list[Prompt]) -> list[int]:
        texts = [p for p in items if isinstance(p, str)]
        tok = TextTokenizer.from_dir(self.model) if texts else None
        return [len(tok.encode(p)) if isinstance(p, str) else len(p) for p in items]  # type: ignore[union-attr]


def _generate_rank(state: ParallelState, model: str, llm_kwargs: dict[str, Any],
                   work: list[tuple[list[Prompt], list[SamplingParams]]], eplb_interval: int
                   ) -> tuple[list[RequestOutput], dict[str, Any]]:
    from deepinfer.entrypoints.llm import LLM

    prompts, params = work[state.rank]
    with use_parallel(state):
        llm = LLM(model, **llm_kwargs)
        runtime = llm.engine.model
        lock = LockStep(runtime.model, state.group, eplb_interval)
        lock.attach(runtime)
        outputs = llm.generate(prompts, params, use_tqdm=False) if prompts else []
        llm.close()  # waits for a step launched ahead (async scheduling), which still ticks
        lock.drain()
    return outputs, rank_report(lock)


def score_rank(state: ParallelState, model: str, prompts_per_rank: list[list[list[int]]],
               load_kwargs: dict[str, Any], eplb_rounds: int = 0
               ) -> tuple[list[list[torch.Tensor]], dict[str, Any]]:
    """Full-sequence float32 logits of this rank's prompts (as `deepinfer score`), in step with the
    other ranks (a spawn target: `spawn(score_rank, n, model, prompts_per_rank, load_kwargs)`).

    With `eplb_rounds`, the experts are then rebalanced from the loads just measured and the prompts
    scored again, that many times: one list of logits per round (a rebalance must change none), and
    the report's `pairs_received` [round][layer] (pairs this rank's experts computed in the round).
    """
    from deepinfer.engine.loader import load_model

    prompts = prompts_per_rank[state.rank]
    rounds, received = [], []
    with use_parallel(state):
        runtime = load_model(model, **load_kwargs)
        lock = LockStep(runtime.model, state.group)
        lock.attach(runtime)
        eps = [blk.moe.ep for blk in runtime.model.blocks if blk.moe.ep is not None]
        for round_ in range(eplb_rounds + 1):
            if round_:
                lock.rebalances.append(rebalance(runtime.model, state.group))
            logits = runtime.score(prompts) if prompts else []
            lock.drain()
            rounds.append([t.float() for t in logits])
            received.append([sum(ep.received) for ep in eps])
    return rounds, {**rank_report(lock), "pairs_received": received}


def rank_report(lock: LockStep) -> dict[str, Any]:
    """What a rank did: forwards in step, dummy forwards, EPLB results, MoE bytes and tokens."""
    eps = [blk.moe.ep for blk in lock.model.blocks if blk.moe.ep is not None]
    return {
        "ticks": lock.ticks,
        "dummy_forwards": lock.dummy_forwards,
        "rebalances": lock.rebalances,
        "moe_bytes_sent": sum(ep.comm.bytes_sent for ep in eps),
        "moe_tokens": sum(ep.comm.tokens for ep in eps),
        "moe_layers": len(eps),
    }
