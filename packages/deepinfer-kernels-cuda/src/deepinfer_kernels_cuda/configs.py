"""Tile configs per (kernel, weight shape, M bucket), stored as JSON per GPU name under configs/.

`benchmarks/kernels/tune.py` writes the files on the device; at serve time a shape without an entry
uses `default` (no autotuning). Keys: "<kernel>:<N>x<K>:<M bucket>", M bucket = next power of two;
batch-invariant configs (one per weight shape, every M): "invariant-<kind>:<N>x<K>:1".
An "fp8" entry with block_m below GEMV_BLOCK_M is a GEMV config (the tuner stores one where the GEMV
beat the tiled kernel, at any M up to 8); the default takes the GEMV up to GEMV_M tokens.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).parent / "configs"
SM_COUNT_FALLBACK = 132
GEMV_M = 1  # tokens up to which FP8 linears run the GEMV (H200: it beats the tiled kernel at 1, loses at 4)
DEQUANT_M = 512  # tokens from which block-scaled linears decode the weight once and call cuBLAS
GEMV_THREADS_K = 8 * 32  # GEMV: columns one warp covers with one 8-byte load per thread
GEMV_BLOCK_M = 16  # the tiled kernel's MMA takes >= 16 tokens: smaller block_m marks a GEMV config


@dataclass(frozen=True)
class TileConfig:
    block_n: int  # weight rows per program (the MMA's M side: swap-AB)
    block_m: int  # tokens per program
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    maxnreg: int = 0  # registers per thread the compiler may use (0: its choice): fewer, more programs per SM
    tma: int = 0  # grouped MoE: nonzero = the TMA kernels (bit moe.TMA_ACTS: down tiles read boxed inputs)
    pdl: int = 0  # FP8 GEMV: 1 = programmatic dependent launch (starts while the previous kernel drains)


def m_bucket(m: int) -> int:
    return 1 << max(m - 1, 0).bit_length()


def key(kernel: str, n: int, k: int, m: int) -> str:
    return f"{kernel}:{n}x{k}:{m_bucket(m)}"


def gpu_file(device: torch.device | int | None = None) -> Path:
    name = torch.cuda.get_device_name(device).replace(" ", "_")
    return CONFIG_DIR / f"{name}.json"


@cache
def _table(path: Path) -> dict[str, TileConfig]:
    if not path.exists():
        return {}
    return {k: TileConfig(**v) for k, v in json.loads(path.read_text()).items()}


def load(path: Path) -> dict[str, TileConfig]:
    """A copy of the table in `path` (empty if there is none)."""
    return dict(_table(path))


def save(path: Path, table: dict[str, TileConfig]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: _fields(v) for k, v in sorted(table.items())}, indent=1) + "\n")
    _table.cache_clear()
    _entry.cache_clear()


def _fields(cfg: TileConfig) -> dict[str, int]:
    """A config as stored: maxnreg, tma and pdl only where set (most entries leave them at 0)."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("maxnreg", "tma", "pdl") or v}


# every linear call looks its config up: memoised, so the host pays a dict hit, not a device query
@lru_cache(maxsize=4096)
def _entry(kernel: str, n: int, k: int, bucket: int, index: int) -> TileConfig | None:
    return _table(gpu_file(index)).get(key(kernel, n, k, bucket))


@cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def block_k(k: int, want: int) -> int:
    """The largest power-of-two divisor of k not above `want` (k is a multiple of 32)."""
    bk = want
    while k % bk:
        bk //= 2
    if bk < 32:
        raise ValueError(f"reduction size {k} is not a multiple of 32")
    return bk


@lru_cache(maxsize=4096)
def default(kernel: str, n: int, k: int, m: int, sm_count: int = SM_COUNT_FALLBACK) -> TileConfig:
    """Shape heuristic: weight streaming for small M, 128-row tiles for large M; split-K wherever the
    output tiles alone leave SMs idle (about 2 programs per SM, each with >= 4 K steps)."""
    if kernel == "fp8" and m <= GEMV_M:
        return default_gemv(n, k, m, sm_count)
    if m <= 64:
        bk = block_k(k, 256 if kernel == "fp8" else 128)
        bn, bm, warps, stages = 64, max(16, m_bucket(m)), 4, 4
    else:
        bk = block_k(k, 64)
        bn, bm, warps, stages = 128, 64 if m <= 256 else 128, 8, 3
    tiles = -(-n // bn) * -(-m // bm)
    split = 1
    while tiles * split < 2 * sm_count and k // (bk * split * 2) >= 4:
        split *= 2
    return TileConfig(bn, bm, bk, split, warps, stages)


def default_gemv(n: int, k: int, m: int, sm_count: int = SM_COUNT_FALLBACK) -> TileConfig:
    """FP8 GEMV: rows per program (dividing 32) as many as still give >= 4 programs per SM (a small
    weight needs all SMs streaming from the start), then K steps of 8 loads of 8 bytes per thread
    (8 rows x 1 chunk ... 1 row x 8 chunks) with the next step prefetched into registers; split K
    only where even 1-row programs leave SMs idle."""
    bn = 8
    while bn > 1 and -(-n // bn) < 4 * sm_count:
        bn //= 2
    warps = 4
    bk = min(GEMV_THREADS_K * warps * (8 // bn), m_bucket(k))  # m_bucket: the next power of two
    steps = -(-k // bk)
    split = 1
    while -(-n // bn) * split < 2 * sm_count and steps >= 2 * split:
        split *= 2
    return TileConfig(bn, m_bucket(m), bk, split, warps, 2 if steps > split else 1)


def is_gemv(cfg: TileConfig) -> bool:
    return cfg.block_m < GEMV_BLOCK_M


@cache
def default_invariant_linear(kind: str, n: int, k: int, sm_count: int = SM_COUNT_FALLBACK) -> TileConfig:
    """Base batch-invariant config of a linear (`linear._invariant_tiles` uses it as it is up to 16 tokens
    and derives the tiles of larger M from it, keeping its split and K order): decode-sized tiles (64
    weight rows, 16 tokens, K steps of 128 FP8/FP4 or 64 dense columns, 3 stages) and a split-K count from
    the shape alone, doubled while the row tiles times the splits stay under three programs per SM and
    every split keeps >= 2 K steps (at M = 1 the weight must stream from all SMs; at large M the splits
    run inside each program, so they cost no partial-sum traffic there). On the H200 (2026-12-02 sweep
    at M = 1 over K steps 128/256, 3/4 stages and splits around this) it picks the winner of all five
    swept shapes."""
    bk = 64 if kind == "dense" else block_k(k, 128)
    tiles, steps = -(-n // 64), -(-k // bk)
    split = 1
    while tiles * split < 3 * sm_count and steps >= 4 * split:
        split *= 2
    return TileConfig(64, 16, bk, split, 4, 3)


def invariant_linear(kind: str, n: int, k: int, device: torch.device) -> TileConfig:
    """Base batch-invariant config of an [n, k] linear: the table's "invariant-<kind>:<N>x<K>:1" entry,
    else `default_invariant_linear`."""
    if device.type != "cuda":
        return default_invariant_linear(kind, n, k)
    index = _index(device)
    found = _entry(f"invariant-{kind}", n, k, 1, index)
    return found or default_invariant_linear(kind, n, k, _sm_count(index))


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (SM_COUNT_FALLBACK elsewhere)."""
    return _sm_count(_index(device)) if device.type == "cuda" else SM_COUNT_FALLBACK


def default_moe(assignments: int, n_experts: int) -> TileConfig:
    """Rows per expert block follow the mean assignments per expert (padding wastes MMA rows). For the
    grouped kernels split_k is 1 or 2 (2: the FP4 high nibbles' products in a second accumulator)."""
    per_expert = assignments / n_experts
    if per_expert <= 16:
        return TileConfig(64, 16, 128, 1, 4, 4)
    if per_expert <= 32:
        return TileConfig(64, 32, 128, 1, 4, 4)
    return TileConfig(128, 64, 64, 1, 8, 3)


def lookup_moe(assignments: int, n_experts: int, hidden: int, inter: int, device: torch.device) -> TileConfig:
    """Config of the grouped expert GEMMs, keyed "moe:<H>x<I>:<assignments bucket>"."""
    if device.type == "cuda":
        found = _entry("moe", hidden, inter, m_bucket(assignments), _index(device))
        if found is not None:
            return found
    return default_moe(assignments, n_experts)


def lookup_moe_down(assignments: int, n_experts: int, hidden: int, inter: int, device: torch.device,
                    gate_up: TileConfig) -> TileConfig:
    """Config of the grouped down GEMM, keyed "moe-down:<H>x<I>:<assignments bucket>", else the gate+up
    config `gate_up` (an entry's block_m must be gate_up's: both kernels read one alignment)."""
    if device.type == "cuda":
        found = _entry("moe-down", hidden, inter, m_bucket(assignments), _index(device))
        if found is not None:
            if found.block_m != gate_up.block_m:
                raise ValueError(f"moe-down:{hidden}x{inter}: block_m {found.block_m}, the gate+up "
                                 f"entry's is {gate_up.block_m}")
            return found
    return gate_up


# decode path of the routed experts: block_m 1 = the GEMVs at this tile (16 weight rows x 256 columns per
# K step, 4 warps, Triton's default stages); block_m >= 16 = the MMA kernels, one block per assignment
MOE_DECODE_DEFAULT = TileConfig(16, 1, 256, 1, 4, 3)


def lookup_moe_decode(hidden: int, inter: int, device: torch.device) -> TileConfig:
    """Decode-path tile of the routed experts (few assignments), keyed "moe-decode:<H>x<I>:1"."""
    if device.type == "cuda":
        found = _entry("moe-decode", hidden, inter, 1, _index(device))
        if found is not None:
            return found
    return MOE_DECODE_DEFAULT


def lookup_moe_decode_down(hidden: int, inter: int, device: torch.device) -> TileConfig | None:
    """Down tile of the fused MoE decode path (routed + shared expert + combine in one launch), keyed
    "moe-decode-down:<H>x<I>:1"; None without an entry: the decode path runs unfused."""
    if device.type != "cuda":
        return None
    return _entry("moe-decode-down", hidden, inter, 1, _index(device))


def lookup(kernel: str, n: int, k: int, m: int, device: torch.device) -> TileConfig:
    if device.type != "cuda":  # the Triton interpreter (TRITON_INTERPRET=1) on CPU tensors
        return default(kernel, n, k, m)
    index = _index(device)
    return _entry(kernel, n, k, m_bucket(m), index) or default(kernel, n, k, m, _sm_count(index))
