"""Seeded random values of a realistic scale for every release tensor (used by the writer).

Every tensor gets its own generator seeded from (seed, name), so values do not depend on shard
layout or generation order, and is produced in row chunks to bound memory. Nothing is left at a
constant: norms, sinks, router biases, mHC base/scale and Engram q/k weights are all random.
"""

from __future__ import annotations

import hashlib
import math

import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8, quantize_fp8_rows
from deepinfer.checkpoint.inventory import TORCH_DTYPES, TensorSpec

CHUNK_ELEMENTS = 1 << 24  # a generation chunk holds about this many elements (whole rows)
LOGIT_STD = 3.0  # LM head scaled so logits of a unit-RMS hidden state have this std


def _seed(seed: int, name: str, chunk: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _distribution(name: str, shape: tuple[int, ...]) -> tuple[str, float, float]:
    """(law, a, b): "normal" mean a std b, or "uniform" on [a, b), chosen by tensor role."""
    fan_in = shape[-1]
    if name.endswith("norm.weight") or name.endswith(("q_weight", "k_weight")):
        return "uniform", 0.7, 1.3  # RMSNorm gains (and Engram's folded norm weights) around 1
    if name.endswith("attn_sink"):
        return "normal", 0.0, 1.0
    if name.endswith(("gate.bias", "gate.bias_vl")):
        return "normal", 0.0, 0.2
    if name.endswith("_base"):  # mHC biases
        return "normal", 0.0, 1.0
    if name.endswith("_scale"):  # mHC mix scales (quantisation scales never come through here)
        return "uniform", 0.1, 1.0
    if name == "embed.weight" or name.endswith(("engram.embed.weight", "markov_head.embed.weight")):
        return "normal", 0.0, 1.0
    if name == "head.weight":
        return "normal", 0.0, LOGIT_STD / math.sqrt(fan_in)
    if name.endswith("markov_head.head.weight"):
        return "normal", 0.0, 0.5 / math.sqrt(fan_in)
    return "normal", 0.0, 1.0 / math.sqrt(fan_in)  # every projection: unit-variance outputs


def _sample(shape: tuple[int, ...], law: tuple[str, float, float], gen: torch.Generator) -> torch.Tensor:
    kind, a, b = law
    if kind == "uniform":
        return torch.rand(shape, generator=gen).mul_(b - a).add_(a)
    return torch.randn(shape, generator=gen).mul_(b).add_(a)


def random_tensors(spec: TensorSpec, scale_spec: TensorSpec | None, seed: int) -> dict[str, torch.Tensor]:
    """Storage tensors for one weight (and its `.scale` companion for quantised kinds)."""
    # the unpacked matrix: packed FP4 stores two columns per byte
    logical = (spec.shape[0], spec.shape[1] * 2) if spec.kind == "fp4" else spec.shape
    law = _distribution(spec.name, logical)
    rows = logical[0] if len(logical) > 1 else 1
    per_row = math.prod(logical) // rows
    # whole 32-row bands per chunk, so FP8 32x32 blocks are never split
    step = max(32, (CHUNK_ELEMENTS // max(per_row, 1)) // 32 * 32)
    out = torch.empty(spec.shape, dtype=TORCH_DTYPES[spec.dtype])
    scale = torch.empty(scale_spec.shape, dtype=TORCH_DTYPES[scale_spec.dtype]) if scale_spec else None
    quantize = {"fp8": quantize_fp8, "fp4": quantize_fp4, "fp8_rows": quantize_fp8_rows}.get(spec.kind)
    for chunk, begin in enumerate(range(0, rows, step)):
        end = min(begin + step, rows)
        gen = torch.Generator().manual_seed(_seed(seed, spec.name, chunk))
        w = _sample((end - begin, *logical[1:]) if len(logical) > 1 else logical, law, gen)
        if quantize is None:
            (out[begin:end] if len(logical) > 1 else out).copy_(w)  # casts to the storage dtype (RNE)
            continue
        q, s = quantize(w)
        out[begin:end] = q
        rows_per_scale = 32 if spec.kind == "fp8" else 1
        scale[begin // rows_per_scale : -(-end // rows_per_scale)] = s
    tensors = {spec.name: out}
    if scale_spec is not None:
        tensors[scale_spec.name] = scale
    return tensors
