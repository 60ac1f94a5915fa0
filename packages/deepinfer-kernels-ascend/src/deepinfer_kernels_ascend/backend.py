"""The `ascend` backend: torch-npu fused ops where CANN has them; the rest run the reference ops,
which are plain PyTorch and therefore execute on the NPU through torch-npu."""

from collections.abc import Callable

import torch

from deepinfer.ops import Backend
from deepinfer.ops.registry import invariant_ops
from deepinfer.plugins import module_available


class AscendBackend(Backend):
    name = "ascend"
    package = "deepinfer-kernels-ascend"
    priority = 100

    def supports(self, device: torch.device) -> bool:
        return device.type == "npu" and module_available("torch_npu")

    def ops(self, *, batch_invariant: bool = False) -> dict[str, Callable]:
        from deepinfer_kernels_ascend import norm

        table = {"rms_norm": norm.rms_norm}
        # nothing here has a batch-invariant mode yet: get_ops names the ops that cannot be invariant
        return invariant_ops(table, ()) if batch_invariant else table
