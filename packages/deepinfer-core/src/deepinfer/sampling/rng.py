"""Counter-based RNG: a uniform number is a pure function of (seed, position, purpose).

No generator state is carried between steps, so a request's draws do not depend on batch composition,
row order, chunking, preemption or async scheduling — only on its seed and the position of the token
being generated. Implemented on int64 tensors (wrapping arithmetic) so it runs on any device.
"""

from __future__ import annotations

import torch

# Purposes keep independent streams for independent decisions at the same position.
PURPOSE_SAMPLE = 0
# speculative decoding (deepinfer.speculators): draft draws, acceptance tests, residual resamples
PURPOSE_DRAFT = 1
PURPOSE_ACCEPT = 2
PURPOSE_RESIDUAL = 3

_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_POS_MUL = _signed(0xD6E8FEB86659FD93)
_PURPOSE_MUL = _signed(0xA0761D6478BD642F)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _finalize(z: torch.Tensor) -> torch.Tensor:
    # SplitMix64 finalizer: a bijective avalanche mix of 64 bits.
    z = z + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def uniform(seeds: torch.Tensor, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """float64 uniforms in [0, 1), one per row; `seeds` hold uint64 bit patterns as int64."""
    key = _finalize(seeds ^ (positions * _POS_MUL) ^ as_int64(purpose * _PURPOSE_MUL))
    key = _finalize(key)  # a second round decorrelates neighbouring positions of one seed
    return _shr(key, 11).to(torch.float64) * (1.0 / (1 << 53))


def as_int64(seed: int) -> int:
    """A uint64 seed as the int64 with the same bits (what `uniform` takes)."""
    return _signed(seed & _MASK64)


def child_seed(seed: int, index: int) -> int:
    """Seed of completion `index` of an n > 1 request; completion 0 keeps the request's seed."""
    if index == 0:
        return seed
    z = _finalize(torch.tensor([as_int64(seed) ^ (index * _POS_MUL)], dtype=torch.int64))
    return int(z.item()) & _MASK64
