"""Reference op implementations, one module per op family. REFERENCE_OPS is the op set."""

from collections.abc import Callable

from deepinfer.ops.reference import norm

REFERENCE_OPS: dict[str, Callable] = {
    "rms_norm": norm.rms_norm,
}
