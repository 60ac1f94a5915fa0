"""Sampling ops at the V4 vocabulary (129280) against the reference ops: time per step and the ratio to
the time of reading the float32 logits once at copy bandwidth (the bytes-read roofline).

    python benchmarks/kernels/sampling.py [--out table.md]

Per batch (1, 64, 256): `greedy` (argmax only), `drawn` (temperature 1, no filter), `filtered`
(temperature 0.8, top-k 50, top-p 0.9, min-p 0.05: the radix search), `penalties` (presence,
frequency, repetition over 512 prompt + 128 generated tokens, a logit bias, a min_tokens ban),
`bitmask` (a structured-output mask on every row). (compute_logprobs has no kernel: the cuda backend
uses the reference's.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from common import backends, copy_bandwidth_gbs, eager_ms, emit, graph_ms, input_sets, parse_args

from deepinfer.ops import Ops
from deepinfer.sampling import SampleRow, SamplingParams, rng
from deepinfer.sampling.sampler import sampling_metadata

V, EOS = 129280, 1
CUDA = torch.device("cuda")
SCENARIOS = {
    "greedy": SamplingParams(temperature=0.0),
    "drawn": SamplingParams(temperature=1.0),
    "filtered": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05),
    "penalties": SamplingParams(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.3,
                                repetition_penalty=1.2, logit_bias={5: 2.0, 77: -3.0}, min_tokens=200,
                                max_tokens=1000, stop_token_ids=[2, 3]),
}


def logits(batch: int) -> torch.Tensor:
    x = torch.randn(batch, V, device=CUDA) * 2.0
    x[:, :20] += 12  # a few strong candidates over a heavy tail
    return x


def rows(batch: int, params: SamplingParams) -> list[SampleRow]:
    prompt = list(range(1000, 1512))
    out = [i % 97 for i in range(128)]
    return [SampleRow(params, rng.as_int64(i), 100 + i, 128, prompt, out) for i in range(batch)]


def case(name: str, batch: int) -> tuple[Callable[[Ops], Callable[[torch.Tensor], object]], int]:
    """Scenario -> (op call on one logits tensor for an op set, bytes of logits it reads)."""
    if name == "bitmask":
        words = torch.randint(-(2**31), 2**31, (batch, -(-V // 32)), device=CUDA, dtype=torch.int64).int()
        return (lambda ops: lambda x: ops.apply_token_bitmask(x, words)), batch * V * 4
    meta, _ = sampling_metadata(rows(batch, SCENARIOS[name]), V, EOS, CUDA)
    if name == "penalties":
        return (lambda ops: lambda x: ops.apply_penalties(x, meta)), batch * V * 4
    return (lambda ops: lambda x: ops.sample_tokens(x, meta)), batch * V * 4


def main() -> None:
    out = parse_args(__doc__).out
    cuda, ref = backends()
    copy = copy_bandwidth_gbs(1.0)
    table = []
    for batch in (1, 64, 256):
        for name in (*SCENARIOS, "bitmask"):
            call, nbytes = case(name, batch)
            sets = input_sets(lambda b=batch: (logits(b),), nbytes)
            ours, theirs, x = call(cuda), call(ref), sets[0][0]
            g_ms = graph_ms(ours, sets)
            e_ms = eager_ms(lambda f=ours, x=x: f(x), rep_ms=25)
            r_ms = eager_ms(lambda f=theirs, x=x: f(x), rep_ms=25)
            roofline_ms = nbytes / (copy * 1e6)
            table.append([name, batch, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3, r_ms / e_ms, g_ms / roofline_ms])
            print(table[-1], flush=True)
    emit(f"Sampling ops, V={V}, float32 logits (copy bandwidth {copy:.0f} GB/s)",
         ["op", "batch", "cuda graph µs", "cuda eager µs", "reference eager µs", "eager speedup",
          "graph / logits-read roofline"], table, out)


if __name__ == "__main__":
    main()
