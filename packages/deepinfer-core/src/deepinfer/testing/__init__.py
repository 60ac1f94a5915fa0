"""Named tiny configs and checkpoint fabrication for tests and benchmarks."""

from deepinfer.testing.checkpoints import write_tiny_checkpoint
from deepinfer.testing.configs import (
    TINY_CONFIG_NAMES,
    flash_slice_config,
    flash_slice_config_dict,
    tiny_config,
    tiny_config_dict,
)
from deepinfer.testing.flash import flash_config_dict

__all__ = [
    "TINY_CONFIG_NAMES",
    "flash_config_dict",
    "flash_slice_config",
    "flash_slice_config_dict",
    "tiny_config",
    "tiny_config_dict",
    "write_tiny_checkpoint",
]
