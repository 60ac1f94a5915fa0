"""Per-step sampling settings as the sampling ops receive them: flat device tensors, row i of every
[B] tensor belonging to logits row i, built once per step on the host (sampling.sampler) and copied
to the device in one transfer. Sparse per-row token lists (logit bias, bans, penalty histories) are
(row, token id) pairs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingMetadata:
    greedy: torch.Tensor  # [B] bool: argmax of the adjusted logits, no draw
    temperature: torch.Tensor  # [B] float32 (1 on greedy rows)
    top_k: torch.Tensor  # [B] int64, the vocabulary size when off
    top_p: torch.Tensor  # [B] float32
    min_p: torch.Tensor  # [B] float32
    filtered: torch.Tensor  # [B] bool: a drawn row with top-k, top-p or min-p on
    seeds: torch.Tensor  # [B] int64: uint64 seed bit patterns of the counter RNG
    positions: torch.Tensor  # [B] int64: position of the token being drawn (the RNG counter)
    presence: torch.Tensor  # [B] float32, 0 where the row has no generated tokens to penalise
    frequency: torch.Tensor  # [B] float32, likewise
    repetition: torch.Tensor  # [B] float32, 1 when off
    bias_rows: torch.Tensor  # [N] int64 } logit bias: logits[row, id] += value
    bias_ids: torch.Tensor  # [N] int64   }
    bias_values: torch.Tensor  # [N] float32 }
    ban_rows: torch.Tensor  # [M] int64 } min_tokens not reached: EOS and stop ids get -inf
    ban_ids: torch.Tensor  # [M] int64   }
    output_rows: torch.Tensor  # [P] int64 } generated tokens, repeated as generated (presence/frequency)
    output_ids: torch.Tensor  # [P] int64   }
    seen_rows: torch.Tensor  # [Q] int64 } prompt and generated tokens (repetition penalty)
    seen_ids: torch.Tensor  # [Q] int64   }
    # Host facts of the step, so ops skip whole stages without reading device values.
    any_drawn: bool
    any_filtered: bool
    any_adjusted: bool  # some bias, ban or penalty applies
