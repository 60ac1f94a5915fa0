"""Triton kernels for NVIDIA GPUs, registered as deepinfer's `cuda` backend."""
