"""Token streams of the corpus splits and seeded batches of windows from them."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from tools.train.corpus import Manifest, read_texts


def token_stream(manifest: Manifest, tokenizer: Tokenizer, split: str) -> torch.Tensor:
    """Every file of `split` as BOS + tokens + EOS, concatenated (int64, CPU)."""
    bos, eos = (
        tokenizer.token_to_id("<｜begin▁of▁sentence｜>"),
        tokenizer.token_to_id("<｜end▁of▁sentence｜>"),
    )
    encodings = tokenizer.encode_batch(list(read_texts(manifest, split)), add_special_tokens=False)
    ids: list[int] = []
    for enc in encodings:
        ids += [bos, *enc.ids, eos]
    return torch.tensor(ids, dtype=torch.int64)


def random_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, length] windows at seeded random offsets of `stream` (same device as the stream)."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    offsets = starts.unsqueeze(-1) + torch.arange(length)
    return stream[offsets.to(stream.device)]


def eval_windows(stream: torch.Tensor, length: int, limit: int | None = None) -> torch.Tensor:
    """Consecutive non-overlapping [n, length] windows covering the stream (the held-out set)."""
    n = stream.numel() // length
    if limit is not None:
        n = min(n, limit)
    return stream[: n * length].view(n, length)
