"""Conformance cases of `apply_token_bitmask` (structured output), judged against a per-token loop."""

from __future__ import annotations

import torch

from deepinfer.testing.conformance import Case, register


def _inputs(rows: int, vocab: int):
    def make(device: torch.device, g: torch.Generator):
        logits = torch.randn(rows, vocab, generator=g).to(device)
        words = torch.randint(-(2**31), 2**31, (rows, -(-vocab // 32)), generator=g, dtype=torch.int64)
        words[0] = -1  # an unconstrained row
        return (logits, words.to(torch.int32).to(device)), {}

    return make


def _oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    logits, bitmask = (a.cpu() for a in args)
    words = bitmask.tolist()
    for r in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            allowed = (words[r][t // 32] >> (t % 32)) & 1
            want = logits[r, t].item() if allowed else float("-inf")
            assert out[r, t].item() == want, f"row {r}, token {t}: {out[r, t].item()} != {want}"


for _rows, _vocab in ((1, 70), (5, 257), (2, 4133)):  # 4133: several kernel blocks, a partial word
    register(Case("apply_token_bitmask", f"rows{_rows}-vocab{_vocab}", _inputs(_rows, _vocab), _oracle))
