"""The `cuda` backend: Triton kernels for the ops we have written; the rest fall back to reference."""

from collections.abc import Callable

import torch

from deepinfer.ops import Backend
from deepinfer.plugins import module_available


class CudaBackend(Backend):
    name = "cuda"
    package = "deepinfer-kernels-cuda"
    priority = 100

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available() and module_available("triton")

    def ops(self) -> dict[str, Callable]:
        # Imported here: the kernel modules import triton, which CPU-only machines may lack.
        from deepinfer_kernels_cuda import norm

        return {"rms_norm": norm.rms_norm}
