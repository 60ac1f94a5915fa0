"""Paged cache blocks and per-sequence state slots: sizing from a byte budget, allocation, freeing.

The model owns the memory (`CausalLM.allocate_cache`); this class only hands out ids. Block 0 and
slot 0 are the model's padding entries and never given to a sequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.sequence import Sequence
from deepinfer.models.interface import CacheLayout, CausalLM

logger = logging.getLogger(__name__)

CPU_DEFAULT_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class CachePlan:
    num_blocks: int  # including padding block 0
    num_slots: int  # including padding slot 0
    budget_bytes: int

    def describe(self, layout: CacheLayout) -> str:
        used = self.num_blocks * layout.bytes_per_block + self.num_slots * layout.bytes_per_slot
        return (f"{self.num_blocks - 1} blocks x {layout.block_size} tokens "
                f"({layout.bytes_per_block} B each), {self.num_slots - 1} state slots "
                f"({layout.bytes_per_slot} B each): {used / 2**20:.1f} MiB of a "
                f"{self.budget_bytes / 2**20:.1f} MiB budget")


def cache_budget(config: EngineConfig, device: torch.device, model: CausalLM | None = None) -> int:
    """Bytes the cache may use: explicit, or a share of the GPU's memory beyond what is in use, less
    what the model's CUDA graphs will hold (a model with `plan_graphs` captures them with its cache)."""
    if config.cache_bytes is not None:
        graph_reserve(model, config, measure_memory=False)  # the capture is still planned
        return config.cache_bytes
    graphs = graph_reserve(model, config)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # a reserve for activations of the largest step; the weights are already counted as used
        budget = int(total * config.gpu_memory_utilization) - (total - free)
        return max(0, int(budget * 0.9) - graphs)
    return CPU_DEFAULT_CACHE_BYTES


def graph_reserve(model: CausalLM | None, config: EngineConfig, measure_memory: bool = True) -> int:
    """Plan the model's start-up graph capture (decode, and verification of the configured drafts) and
    return the bytes the graphs will take (measured unless `measure_memory` is off: then 0); 0 for
    models without graphs."""
    plan = getattr(model, "plan_graphs", None)
    if plan is None:
        return 0
    drafts = (config.num_draft_tokens or 0) if config.speculator != "none" else 0  # None: captured lazily
    reserve = plan(config.max_num_seqs, drafts, config.max_model_len, measure_memory=measure_memory)
    if reserve:
        logger.info("cache budget: %.0f MiB kept for CUDA graphs", reserve / 2**20)
    return reserve


def plan_cache(layout: CacheLayout, budget: int, config: EngineConfig) -> CachePlan:
    """Slots for every running sequence (fewer if they would take over half the budget), blocks from
    the rest, never more blocks than max_num_seqs full-length sequences can use."""
    per_seq_blocks = -(-config.max_model_len // layout.block_size)
    slots = config.max_num_seqs
    if layout.bytes_per_slot and slots * layout.bytes_per_slot > budget // 2:
        slots = max(1, budget // 2 // layout.bytes_per_slot)
        logger.warning("cache budget holds state for only %d sequences (max_num_seqs=%d)",
                       slots, config.max_num_seqs)
    left = budget - (slots + 1) * layout.bytes_per_slot
    cap = config.max_num_seqs * per_seq_blocks
    blocks = min(cap, left // layout.bytes_per_block - 1) if layout.bytes_per_block else cap
    if blocks < 1 or left < 0:
        raise MemoryError(
            f"a cache budget of {budget / 2**20:.1f} MiB cannot hold one state slot "
            f"({layout.bytes_per_slot} B) and one block ({layout.bytes_per_block} B); raise "
            "gpu_memory_utilization / cache_bytes or lower max_num_seqs")
    return CachePlan(num_blocks=blocks + 1, num_slots=slots + 1, budget_bytes=budget)


class CacheManager:
    def __init__(self, block_size: int, plan: CachePlan):
        self.block_size = block_size
        self.num_blocks = plan.num_blocks - 1  # usable
        self.num_slots = plan.num_slots - 1
        # stacks: most recently freed first, which keeps hot ids hot
        self._free_blocks = list(range(plan.num_blocks - 1, 0, -1))
        self._free_slots = list(range(plan.num_slots - 1, 0, -1))

    @property
    def free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free_blocks) / self.num_blocks

    def all_free(self) -> bool:
        return self.free_blocks == self.num_blocks and self.free_slots == self.num_slots

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def extra_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` lacks to hold `num_tokens` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(seq.blocks))

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Extend `seq`'s block table to cover `num_tokens`; False (nothing taken) if short of blocks."""
        need = self.extra_blocks(seq, num_tokens)
        if need > len(self._free_blocks):
            return False
        for _ in range(need):
            seq.blocks.append(self._free_blocks.pop())
        return True

    def take_slot(self, seq: Sequence) -> bool:
        if not self._free_slots:
            return False
        seq.slot = self._free_slots.pop()
        return True

    def free(self, seq: Sequence) -> None:
        self._free_blocks.extend(reversed(seq.blocks))
        seq.blocks = []  # a new list: an in-flight step may still hold the old one
        if seq.slot:
            self._free_slots.append(seq.slot)
            seq.slot = 0
