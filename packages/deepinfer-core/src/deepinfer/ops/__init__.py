"""The op set models call, and the registry of backends that implement it.

`get_ops()` returns an `Ops` namespace for a device: each op comes from the selected backend, or from
the pure-PyTorch `reference` backend where the selected one lacks it, except that ops sharing prepared
weights come from one backend as a group (`registry.OP_GROUPS`). What layer ops receive besides
tensors lives beside them: prepared-weight containers in `ops.weights`, per-step sampling settings in
`ops.sampling`.
"""

from deepinfer.ops.registry import Backend, BackendError, Ops, available_backends, get_ops

__all__ = ["Backend", "BackendError", "Ops", "available_backends", "get_ops"]
