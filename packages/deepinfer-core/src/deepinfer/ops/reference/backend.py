"""The pure-PyTorch backend: defines what every op means, runs on any torch device."""

from collections.abc import Callable

import torch

from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.ops.registry import Backend, invariant_ops


class ReferenceBackend(Backend):
    name = "reference"
    package = "deepinfer-core"
    priority = 0
    # Elementwise, gathers, exact max/amax reductions, or softmax/cumsum along a row (torch runs those
    # one row per thread group, configured by the row length), or weight preparation. The others use
    # matmuls or sum/mean reductions, whose kernels and split strategies torch picks from the whole
    # tensor's shape.
    row_wise = frozenset({
        "prepare_linear", "prepare_experts",
        "rope_interleaved", "engram_hash", "engram_lookup", "cache_write",
        "fp8_quantize", "fp8_dequantize", "nvfp4_quantize", "nvfp4_dequantize", "mxfp4_quantize",
        "mxfp4_dequantize", "apply_penalties", "apply_token_bitmask", "sample_tokens", "compute_logprobs",
    })

    def supports(self, device: torch.device) -> bool:
        return True

    def ops(self, *, batch_invariant: bool = False) -> dict[str, Callable]:
        return invariant_ops(REFERENCE_OPS, self.row_wise) if batch_invariant else dict(REFERENCE_OPS)
