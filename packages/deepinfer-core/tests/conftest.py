"""Shared fixtures. The engine tests run against `ToyLM`, a small deterministic `CausalLM` test double.

`ToyLM` keeps the real contract honest: token ids live in the paged blocks the engine hands it, the
per-slot state is a hash chain over positions (so a segment must start where the slot's state ends, or
earlier: rollback), and every forward re-reads the earlier tokens from the blocks and checks them
against the slot state, so a wrong block table, a missing reset or a block shared by two sequences
fails loudly. Logits are a fixed random row chosen by the hash of the whole prefix: batch invariant.
When the batch carries `input_ids` those are the token values (as the contract says): every list entry
must then be a negative stand-in or equal its `input_ids` value.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer.models.interface import CacheLayout, ForwardBatch, ForwardOutput, SequenceSegment

_MASK = (1 << 61) - 1


class ToyLM:
    """Deterministic toy causal LM over `vocab_size` tokens (set `fork=False` for no cache copies)."""

    max_backtrack = 0

    def __init__(self, vocab_size: int = 320, eos_token_id: int = 1, block_size: int = 4,
                 table_rows: int = 2039, seed: int = 0):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.block_size = block_size
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(table_rows, vocab_size, generator=g) * 3.0
        self.table[:, eos_token_id] -= 4.0  # long enough outputs to exercise the scheduler
        self.forward_calls = 0
        self.batch_sizes: list[int] = []
        self.device_id_batches = 0  # forwards whose values came (partly) from `input_ids` only
        # forward_rows: (rows run, rows planned, rows run by each segment planned with drafts)
        self.split_rows: list[tuple[int, int, list[int]]] = []

    def cache_layout(self) -> CacheLayout:
        return CacheLayout(self.block_size, bytes_per_block=8 * self.block_size, bytes_per_slot=64)

    def allocate_cache(self, num_blocks: int, num_slots: int) -> None:
        self.blocks = torch.full((num_blocks, self.block_size), -1, dtype=torch.long)
        self.slots: list[list[int]] = [[] for _ in range(num_slots)]

    def reset_slot(self, slot: int) -> None:
        self.slots[slot] = []

    def copy_slot(self, src: int, dst: int) -> None:
        self.slots[dst] = list(self.slots[src])

    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        self.blocks[dst] = self.blocks[src]

    @staticmethod
    def _mix(h: int, token: int, pos: int) -> int:
        return ((h * 1_000_003) ^ (token * 7919 + pos * 104_729 + 12_345)) & _MASK

    def _read(self, table: list[int], n: int) -> list[int]:
        return [int(self.blocks[table[p // self.block_size], p % self.block_size]) for p in range(n)]

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        self.forward_calls += 1
        self.batch_sizes.append(len(batch.segments))
        hashes: list[int] = []
        values = None if batch.input_ids is None else batch.input_ids.tolist()
        if values is not None:
            assert len(values) == sum(len(s.token_ids) for s in batch.segments), "input_ids length"
            self.device_id_batches += 1
        offset = 0
        for seg in batch.segments:
            token_ids = seg.token_ids
            if values is not None:
                token_ids = values[offset:offset + len(seg.token_ids)]
                assert all(t < 0 or t == v for t, v in zip(seg.token_ids, token_ids)), "lists disagree"
                offset += len(token_ids)
            assert seg.slot > 0 and 0 not in seg.block_table[: -(-(seg.start_pos + len(seg.token_ids))
                                                              // self.block_size)], "padding entry used"
            state = self.slots[seg.slot]
            assert seg.start_pos <= len(state), f"segment at {seg.start_pos} but slot holds {len(state)}"
            del state[seg.start_pos:]  # rollback is free
            h = 0
            for pos, tok in enumerate(self._read(seg.block_table, seg.start_pos)):
                h = self._mix(h, tok, pos)
            assert h == (state[-1] if state else 0), "paged blocks disagree with the slot state"
            for j, tok in enumerate(token_ids):
                assert 0 <= tok < self.vocab_size, f"bad input token {tok}"
                pos = seg.start_pos + j
                self.blocks[seg.block_table[pos // self.block_size], pos % self.block_size] = tok
                h = self._mix(h, tok, pos)
                state.append(h)
            new = state[seg.start_pos:]
            hashes += {"none": [], "last": new[-1:], "all": new}[seg.logits]
        idx = torch.tensor([h % self.table.shape[0] for h in hashes], dtype=torch.long)
        return ForwardOutput(self.table[idx].clone())


    def device_rows_fit(self, segments) -> bool:
        """Decode and verification steps (a logits row per token), as the real runtime's device build."""
        return all(s.logits == "all" or (s.logits == "last" and len(s.token_ids) == 1) for s in segments)

    def forward_rows(self, batch: ForwardBatch, rows: torch.Tensor, total: int) -> torch.Tensor:
        """The forward of the segments cut to their first rows[b] tokens (a CPU toy: reads the counts)."""
        counts = rows.tolist()
        assert sum(counts) == total and all(1 <= n <= len(s.token_ids)
                                            for n, s in zip(counts, batch.segments, strict=True))
        drafted = [n for n, s in zip(counts, batch.segments, strict=True) if len(s.token_ids) > 1]
        self.split_rows.append((total, sum(len(s.token_ids) for s in batch.segments), drafted))
        segs, ids, at = [], [], 0
        for n, s in zip(counts, batch.segments, strict=True):
            segs.append(SequenceSegment(s.slot, s.block_table, s.start_pos, s.token_ids[:n], s.logits))
            if batch.input_ids is not None:
                ids.append(batch.input_ids[at:at + n])
            at += len(s.token_ids)
        return self.forward(ForwardBatch(segs, torch.cat(ids) if ids else None)).logits


class ToyLMNoFork:
    """The same model without the optional cache-copy capability (n > 1 prefills each completion)."""

    def __init__(self, **kwargs: int):
        self._lm = ToyLM(**kwargs)

    def __getattr__(self, name: str):
        if name in ("copy_slot", "copy_blocks"):
            raise AttributeError(name)
        return getattr(self._lm, name)


@pytest.fixture
def toy_models() -> tuple[type[ToyLM], type[ToyLMNoFork]]:
    """The toy model classes: (with cache copies for n > 1 sharing, without)."""
    return ToyLM, ToyLMNoFork


@pytest.fixture(scope="session")
def synthetic_tokenizer():
    from deepinfer.engine.loader import TextTokenizer
    from deepinfer.tokenizer import build_synthetic_tokenizer
    from deepinfer.tokenizer.synthetic import BOS

    return TextTokenizer(build_synthetic_tokenizer(), bos_token=BOS)


def _make_engine(model=None, tokenizer=None, **config):
    from deepinfer.engine import EngineConfig, LLMEngine

    config = {"max_model_len": 96, "max_num_seqs": 8, "max_num_batched_tokens": 32,
              "cache_bytes": 1 << 20, "log_stats_interval": 0, **config}
    return LLMEngine(model if model is not None else ToyLM(), tokenizer, EngineConfig(**config))


def _drain(engine) -> dict:
    """Step until idle; final outputs by request id (every engine here also must end with no leak)."""
    done = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert not engine.has_unfinished_requests(), "engine did not finish"
    assert engine.cache.all_free(), "cache blocks or slots leaked"
    return done


@pytest.fixture
def make_engine():
    """`make_engine(model=None, tokenizer=None, **EngineConfig fields)`; closed after the test."""
    engines = []

    def make(model=None, tokenizer=None, **config):
        engines.append(_make_engine(model, tokenizer, **config))
        return engines[-1]

    yield make
    for e in engines:
        e.close()


@pytest.fixture
def drain():
    return _drain


def completions(out) -> list[list[int]]:
    return [c.token_ids for c in out.outputs]


@pytest.fixture
def tokens_of():
    """Token ids of every completion of a RequestOutput."""
    return completions


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    """A real tiny DeepSeek-V4.1 checkpoint (random weights, synthetic tokenizer) for end-to-end tests."""
    from deepinfer.checkpoint.writer import write_checkpoint
    from deepinfer.testing import tiny_config
    from deepinfer.tokenizer import build_synthetic_tokenizer

    out = tmp_path_factory.mktemp("tiny-v41")
    tokenizer = build_synthetic_tokenizer()
    write_checkpoint(tiny_config("c1_yoco"), out, seed=0, tokenizer=tokenizer, progress=False)
    return str(out)
