"""Sampling: `SamplingParams`, the sampler, the counter-based RNG, incremental detokenization."""

from deepinfer.sampling.params import SamplingParams
from deepinfer.sampling.sampler import Sampler, SampleRow, TokenLogprob

__all__ = ["SampleRow", "Sampler", "SamplingParams", "TokenLogprob"]
