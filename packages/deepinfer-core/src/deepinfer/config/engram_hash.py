"""Engram hash constants derived from the config (model spec §9.3): table primes and multipliers.

They live next to the config because the table row counts (and so the checkpoint shapes) depend on
them; the model's hashing imports the same functions so both sides cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # deterministic for every n < 3.3e24


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def engram_primes(
    layer_ids: Sequence[int], max_ngram_size: int, n_heads: int, vocab_size: int
) -> list[list[list[int]]]:
    """primes[layer][order - 2][head]: each search restarts at vocab_size - 1 but never reuses a prime."""
    used: set[int] = set()
    out = []
    for _ in layer_ids:
        per_layer = []
        for _order in range(2, max_ngram_size + 1):
            current, heads = vocab_size - 1, []
            for _head in range(n_heads):
                current += 1
                while not is_prime(current) or current in used:
                    current += 1
                used.add(current)
                heads.append(current)
            per_layer.append(heads)
        out.append(per_layer)
    return out


def engram_table_rows(
    layer_ids: Sequence[int], max_ngram_size: int, n_heads: int, vocab_size: int
) -> list[int]:
    """Rows of each Engram layer's table (= sum of its primes; no padding on disk)."""
    primes = engram_primes(layer_ids, max_ngram_size, n_heads, vocab_size)
    return [sum(sum(order) for order in layer) for layer in primes]


def engram_multipliers(layer_id: int, max_ngram_size: int, compressed_vocab_size: int) -> list[int]:
    """Odd per-shift hash multipliers of one Engram layer, drawn from NumPy's seeded generator."""
    bound = max(1, (2**63 - 1) // compressed_vocab_size // 2)
    draws = np.random.default_rng(10007 * layer_id).integers(0, bound, size=max_ngram_size, dtype=np.int64)
    return [2 * int(v) + 1 for v in draws]
