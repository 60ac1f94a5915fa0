"""Seeded random values of a realistic scale for every release tensor.

`random_tensors` (the writer's): every tensor gets its own generator seeded from (seed, name), so
values do not depend on shard layout or generation order, and is produced in row chunks to bound
memory. Nothing is left at a constant: norms, sinks, router biases, mHC base/scale and Engram q/k
weights are all random.

`random_weights` (`--load-format dummy`, benchmarks): a whole model's tensors drawn on the target
device in their storage formats (a device's generator gives other values than the CPU's, the same on
every run); the packed FP4 experts get uniformly random bytes (drawing and quantising the Flash widths'
6 GB of experts per layer would dominate the load).
"""

from __future__ import annotations

import hashlib
import math

import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8, quantize_fp8_rows
from deepinfer.checkpoint.inventory import TORCH_DTYPES, TensorSpec, iter_inventory
from deepinfer.config import ModelConfig
from deepinfer.tokenizer import build_synthetic_tokenizer, compressed_vocab

CHUNK_ELEMENTS = 1 << 24  # a generation chunk holds about this many elements (whole rows)
LOGIT_STD = 3.0  # LM head scaled so logits of a unit-RMS hidden state have this std
E2M1_RMS = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)  # of uniformly random codes


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
        return torch.rand(shape, generator=gen, device=gen.device).mul_(b - a).add_(a)
    return torch.randn(shape, generator=gen, device=gen.device).mul_(b).add_(a)


def random_tensors(spec: TensorSpec, scale_spec: TensorSpec | None, seed: int,
                   device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Storage tensors for one weight (and its `.scale` companion for quantised kinds), on `device`."""
    # the unpacked matrix: packed FP4 stores two columns per byte
    logical = (spec.shape[0], spec.shape[1] * 2) if spec.kind == "fp4" else spec.shape
    law = _distribution(spec.name, logical)
    rows = logical[0] if len(logical) > 1 else 1
    per_row = math.prod(logical) // rows
    # whole 32-row bands per chunk, so FP8 32x32 blocks are never split
    step = max(32, (CHUNK_ELEMENTS // max(per_row, 1)) // 32 * 32)
    out = torch.empty(spec.shape, dtype=TORCH_DTYPES[spec.dtype], device=device)
    scale = (torch.empty(scale_spec.shape, dtype=TORCH_DTYPES[scale_spec.dtype], device=device)
             if scale_spec else None)
    quantize = {"fp8": quantize_fp8, "fp4": quantize_fp4, "fp8_rows": quantize_fp8_rows}.get(spec.kind)
    for chunk, begin in enumerate(range(0, rows, step)):
        end = min(begin + step, rows)
        gen = torch.Generator(device=device).manual_seed(_seed(seed, spec.name, chunk))
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


def weight_groups(config: ModelConfig) -> list[list[TensorSpec]]:
    """The inventory as [weight] or [weight, scale] groups (a quantised weight and its scales)."""
    groups: list[list[TensorSpec]] = []
    for spec in iter_inventory(config):
        if spec.kind == "scale":
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return groups


def _uniform_fp4(rows: int, packed_cols: int, device: torch.device,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random E2M1 bytes with one power-of-two scale giving unit-variance outputs."""
    cols = packed_cols * 2
    data = torch.randint(-128, 128, (rows, packed_cols), dtype=torch.int8, device=device, generator=gen)
    byte = 127 + round(math.log2(1 / (E2M1_RMS * math.sqrt(cols))))
    scale = torch.full((rows, cols // 32), byte, dtype=torch.uint8, device=device)
    return data, scale.view(torch.float8_e8m0fnu)


def random_weights(config: ModelConfig, device: torch.device | str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of `config`'s inventory on `device`, in its storage dtype; same seed, same values."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for group in weight_groups(config):
        tensors.update(random_group(group, seed, device, gen))
    return tensors


def random_group(group: list[TensorSpec], seed: int, device: torch.device,
                 gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One `weight_groups` entry's tensors as `random_weights` draws them (FP4 weights from `gen`)."""
    spec = group[0]
    if spec.kind == "fp4":
        data, scale = _uniform_fp4(*spec.shape, device, gen)
        return {spec.name: data, group[1].name: scale}
    return random_tensors(spec, group[1] if len(group) > 1 else None, seed, device)


def dummy_token_map(config: ModelConfig) -> list[int] | None:
    """Engram's token -> compressed id map for a model without its tokenizer: the synthetic tokenizer's
    when the vocabulary is its size, else ids modulo the compressed size (a stand-in of the same
    shape); None without Engram."""
    t = config.text
    if not t.has_engram:
        return None
    synthetic = build_synthetic_tokenizer()
    if t.vocab_size == synthetic.get_vocab_size(with_added_tokens=True):
        return list(compressed_vocab(synthetic).token_map)
    return [i % t.engram_compressed_vocab_size for i in range(t.vocab_size)]
