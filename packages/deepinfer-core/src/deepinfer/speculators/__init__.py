"""Speculative-decoding plugins, discovered through the `deepinfer.speculators` entry-point group."""

from deepinfer.speculators.registry import SpeculatorError, available_speculators, get_speculator

__all__ = ["SpeculatorError", "available_speculators", "get_speculator"]
