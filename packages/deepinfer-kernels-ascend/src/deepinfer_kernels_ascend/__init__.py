"""Ascend NPU ops on torch-npu, registered as deepinfer's `ascend` backend."""
