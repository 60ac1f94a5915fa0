"""Conformance cases of the sampling ops over random batches that mix every setting: logit bias,
min_tokens bans, presence/frequency/repetition penalties, greedy and drawn rows, top-k/top-p/min-p,
-inf and tied logits, logprob rows."""

from __future__ import annotations

import random

import torch

from deepinfer.ops.reference.sampling import sample_tokens
from deepinfer.sampling import SampleRow, SamplingParams, rng
from deepinfer.sampling.sampler import sampling_metadata
from deepinfer.testing.conformance import Args, Case, register

VOCAB = 600
EOS = 1


def _params(r: random.Random) -> dict:
    kw: dict = {"temperature": r.choice([0.0, 0.0, 0.4, 1.0, 1.0, 1.7])}
    if r.random() < 0.5:
        kw["top_k"] = r.choice([1, 3, 40, VOCAB + 10])
    if r.random() < 0.5:
        kw["top_p"] = r.choice([0.05, 0.5, 0.9, 1.0])
    if r.random() < 0.4:
        kw["min_p"] = r.choice([0.01, 0.1, 0.6])
    if r.random() < 0.3:
        kw["presence_penalty"] = r.choice([-1.0, 0.5, 2.0])
    if r.random() < 0.3:
        kw["frequency_penalty"] = r.choice([-0.7, 0.3, 1.5])
    if r.random() < 0.3:
        kw["repetition_penalty"] = r.choice([0.7, 1.0, 1.3, 3.0])
    if r.random() < 0.3:
        kw["logit_bias"] = {r.randrange(VOCAB): r.uniform(-100, 100) for _ in range(r.randint(1, 4))}
    if r.random() < 0.3:
        kw["min_tokens"] = r.randint(1, 8)
        kw["stop_token_ids"] = [r.randrange(VOCAB) for _ in range(r.randint(0, 3))]
        kw["ignore_eos"] = r.random() < 0.3
    if r.random() < 0.4:
        kw["logprobs"] = r.choice([0, 1, 5])
    return kw


def random_batch(seed: int, size: int) -> tuple[torch.Tensor, list[SampleRow]]:
    """Logits [size, VOCAB] (with -inf and tied entries) and one random row per logit row."""
    r = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(size, VOCAB, generator=g) * r.choice([0.5, 2.0, 6.0])
    logits[:, r.randrange(VOCAB)] = float("-inf")
    logits[:, 7] = logits[:, 8]  # ties
    rows = []
    for _ in range(size):
        params = SamplingParams(**_params(r))
        row = SampleRow(params, rng.as_int64(r.getrandbits(64)), r.randrange(1 << 20), r.randrange(12))
        if params.has_penalties:
            row.prompt_ids = [r.randrange(VOCAB) for _ in range(r.randint(0, 30))]
            row.output_ids = [r.randrange(VOCAB) for _ in range(row.num_outputs)]
        rows.append(row)
    return logits, rows



def _inputs(seed: int, size: int, stage: str):
    def make(device: torch.device, g: torch.Generator) -> Args:
        logits, rows = random_batch(seed, size)
        meta, logprob_rows = sampling_metadata(rows, VOCAB, EOS, device)
        logits = logits.to(device)
        if stage == "sample":
            return (_adjusted(logits, rows), meta), {}
        if stage == "logprobs":
            return (logits, logits.argmax(-1), logprob_rows, 5), {}
        return (logits, meta), {}

    return make


def _adjusted(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Row by row: bias, min_tokens ban, presence/frequency over generated tokens, repetition."""
    x = logits.clone()
    for i, r in enumerate(rows):
        p = r.params
        for token, value in p.logit_bias.items():
            x[i, token] += torch.tensor(value, dtype=torch.float32)
        if r.num_outputs < p.min_tokens:
            x[i, [*p.stop_token_ids, *([] if p.ignore_eos else [EOS])]] = float("-inf")
        if p.has_penalties and r.output_ids and (p.presence_penalty or p.frequency_penalty):
            for token in set(r.output_ids):
                x[i, token] -= p.frequency_penalty * r.output_ids.count(token) + p.presence_penalty
        if p.has_penalties and p.repetition_penalty != 1.0:
            for token in {*r.prompt_ids, *r.output_ids}:
                v = x[i, token]
                x[i, token] = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
    return x


def _penalties_oracle(seed: int, size: int):
    def check(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
        logits, rows = random_batch(seed, size)
        torch.testing.assert_close(out, _adjusted(logits, rows), atol=1e-5, rtol=1e-6)

    return check


def _sample_oracle(seed: int, size: int):
    """Greedy rows take the argmax; a drawn row's token survives its filters (float64, with slack at
    the top-p / min-p edges); every row equals the same row sampled alone."""

    def check(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
        x = args[0]
        _, rows = random_batch(seed, size)
        assert out.shape == (size,) and out.dtype == torch.int64
        for i, r in enumerate(rows):
            p, token = r.params, int(out[i])
            if p.greedy:
                assert token == int(x[i].argmax()), f"row {i}: greedy token {token}"
                continue
            probs = torch.softmax(x[i].double() / p.temperature, -1)
            order = probs.argsort(descending=True, stable=True)
            rank = int((order == token).nonzero()[0, 0])
            assert probs[token] > 0, f"row {i}: token {token} has probability 0"
            assert p.top_k <= 0 or rank < p.top_k, f"row {i}: rank {rank} beyond top_k {p.top_k}"
            assert float(probs[order[:rank]].sum()) < p.top_p + 1e-6, f"row {i}: outside top_p"
            assert float(probs[token]) >= p.min_p * float(probs[order[0]]) - 1e-6, f"row {i}: below min_p"
            alone, _ = sampling_metadata([r], VOCAB, EOS, x.device)
            assert int(sample_tokens(x[i : i + 1], alone)[0]) == token, f"row {i}: differs when alone"

    return check


def _logprobs_oracle(out: tuple, args: tuple, kwargs: dict) -> None:
    logits, tokens, rows, k = args
    chosen, top_v, top_i = out
    lp = torch.log_softmax(logits.double(), -1)[rows]
    torch.testing.assert_close(chosen.double(), lp.gather(1, tokens[rows, None])[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(top_v.double(), lp.topk(k, -1).values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp.gather(1, top_i), top_v.double(), atol=1e-5, rtol=1e-5)  # ids match values


for _seed, _size in ((21, 1), (22, 7), (23, 40)):
    register(Case("apply_penalties", f"rows{_size}", _inputs(_seed, _size, "penalties"),
                  _penalties_oracle(_seed, _size)))
    register(Case("sample_tokens", f"rows{_size}", _inputs(_seed, _size, "sample"),
                  _sample_oracle(_seed, _size)))
    register(Case("compute_logprobs", f"rows{_size}", _inputs(_seed, _size, "logprobs"), _logprobs_oracle))
