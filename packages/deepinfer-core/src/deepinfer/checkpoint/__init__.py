"""Release checkpoint format: tensor codecs, expected inventory, loader and random-weight writer."""

from deepinfer.checkpoint.formats import (
    dequantize_fp4,
    dequantize_fp8,
    dequantize_fp8_rows,
    quantize_fp4,
    quantize_fp8,
    quantize_fp8_rows,
    ue8m0_to_float,
    unpack_fp4,
)
from deepinfer.checkpoint.inventory import TensorSpec, inventory, iter_inventory
from deepinfer.checkpoint.loader import Checkpoint, CheckpointError, LoadStats, load_checkpoint
from deepinfer.checkpoint.writer import WriteStats, write_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "LoadStats",
    "TensorSpec",
    "WriteStats",
    "dequantize_fp4",
    "dequantize_fp8",
    "dequantize_fp8_rows",
    "inventory",
    "iter_inventory",
    "load_checkpoint",
    "quantize_fp4",
    "quantize_fp8",
    "quantize_fp8_rows",
    "ue8m0_to_float",
    "unpack_fp4",
    "write_checkpoint",
]
