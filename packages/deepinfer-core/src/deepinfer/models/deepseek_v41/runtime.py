"""The engine-facing runtime (CausalLM): ForwardBatch -> StepMetadata -> layers -> ForwardOutput.

Each forward builds its StepMetadata once (metadata.py: host index arithmetic, one copy to the
device), calls the backend's `plan(metadata)` hook, then runs the model on tensors only. Besides the
attention caches (deepinfer.cache, per-slot rings and paged blocks) the runtime keeps one small
per-slot ring of recent token ids, so Engram n-grams can look back across forward calls and across
rollbacks of up to `max_backtrack` tokens.

On CUDA, decode and verification steps replay CUDA graphs of `run_step`, and DSpark drafts graphs of
the draft forward (graphs.py), unless `RuntimeOptions.cuda_graphs` is off; other steps run eagerly.
`forward_rows` runs a verification step whose rows per sequence are device values (an asynchronous
confidence split): its metadata is built on the device (device_metadata.py), replayed through graphs
of its total rows (split_graphs.py) or eagerly.
`plan_graphs` (called by the engine's cache sizing) makes each new cache capture its graphs ahead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from deepinfer.cache import CachePrecision, KVCache, cache_layout
from deepinfer.checkpoint.loader import load_checkpoint
from deepinfer.checkpoint.randomize import dummy_token_map, random_weights
from deepinfer.config import ModelConfig, TextConfig, load_model_config
from deepinfer.models.deepseek_v41.attention import Attention
from deepinfer.models.deepseek_v41.device_metadata import DeviceMetadataBuilder
from deepinfer.models.deepseek_v41.dspark import DSpark
from deepinfer.models.deepseek_v41.graphs import (
    CudaRecorder,
    DecodeGraphs,
    DraftGraphs,
    GraphPlan,
    graph_buckets,
    probe_graph_memory,
)
from deepinfer.models.deepseek_v41.metadata import MetadataBuilder, StepMetadata
from deepinfer.models.deepseek_v41.model import DeepseekV41Model, TokenInputs
from deepinfer.models.deepseek_v41.split_graphs import SplitGraphs
from deepinfer.models.deepseek_v41.step_state import (
    BoundedReplay,
    ReplayMode,
    StepState,
    check_replay,
    step_geometry,
)
from deepinfer.models.interface import CacheLayout, ForwardBatch, ForwardOutput, SequenceSegment
from deepinfer.ops import Ops, get_ops
from deepinfer.ops.recorder import Recorder
from deepinfer.tokenizer import compressed_vocab

logger = logging.getLogger(__name__)

_ID_BYTES = 8


@dataclass(frozen=True)
class RuntimeOptions:
    cache_precision: CachePrecision = "exact"
    max_backtrack: int | None = None  # None: DSpark block size + 1 (at least 1)
    replay_mode: ReplayMode = "off"
    replay_keep: int = 140
    cuda_graphs: bool = True  # CUDA: replay graphs of decode/verification steps and DSpark drafts (graphs.py)
    cuda_graph_sizes: tuple[int, ...] | None = None  # the graphs' batch sizes (None: graphs.BUCKETS)
    batch_invariant: bool = False  # a row's results never depend on the batch (needs invariant ops)


class DeepseekV41Runtime:
    """CausalLM for DeepSeek-V4.1 on one device."""

    def __init__(self, model: DeepseekV41Model, dspark: DSpark | None, options: RuntimeOptions) -> None:
        cfg: TextConfig = model.cfg
        self.model, self.dspark, self.options = model, dspark, options
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.eos_token_id = cfg.eos_token_id
        self.max_backtrack = options.max_backtrack or max((cfg.dspark_block_size or 0) + 1, 1)
        self.replay = BoundedReplay(options.replay_mode, options.replay_keep)
        check_replay(cfg, self.replay, self.max_backtrack)
        # Engram look-back: the N-1 tokens before a segment, which may start max_backtrack tokens back
        self.history_len = self.max_backtrack + cfg.engram_max_ngram_size - 1 if cfg.has_engram else 0
        self.device = model.embed.device
        self.cache: KVCache | None = None
        self.builder: MetadataBuilder | None = None
        self.device_builder: DeviceMetadataBuilder | None = None  # steps with device row counts
        self.history: torch.Tensor | None = None  # Engram: [slots, history_len] ids, position p at p % len
        self.last_is_consumer = model.blocks[-1].spec.is_yoco_consumer
        self.graphs: DecodeGraphs | None = None
        self.split_graphs: SplitGraphs | None = None  # device-split verification steps (forward_rows)
        self.graph_recorder: Recorder | None = None  # when set, each cache gets graphs recorded by it
        self.graph_plan: GraphPlan | None = None  # what allocate_cache captures ahead (plan_graphs)
        self.graph_buckets = graph_buckets(options.cuda_graph_sizes)
        if options.cuda_graphs:
            if self.device.type != "cuda":
                logger.info("CUDA graphs: not available on %s, every step runs eagerly", self.device)
            elif any(blk.moe.ep is not None for blk in model.blocks):
                # expert parallelism exchanges row counts through the host: a step is not capturable
                logger.info("CUDA graphs: off under expert parallelism, every step runs eagerly")
            else:
                self.graph_recorder = CudaRecorder(self.device)

    # --- cache management (interface.CausalLM)

    def cache_layout(self) -> CacheLayout:
        layout = cache_layout(self.cfg, self.options.cache_precision, self.model.dtype, self.max_backtrack)
        extra = self.history_len * _ID_BYTES
        return CacheLayout(layout.block_size, layout.bytes_per_block, layout.bytes_per_slot + extra)

    def allocate_cache(self, num_blocks: int, num_slots: int) -> None:
        self.cache = KVCache(
            self.cfg,
            num_blocks,
            num_slots,
            self.options.cache_precision,
            self.model.dtype,
            self.max_backtrack,
            self.device,
        )
        if self.history_len:
            self.history = torch.zeros(num_slots, self.history_len, dtype=torch.int64, device=self.device)
        n = self.cfg.engram_max_ngram_size if self.history_len else 0
        geometry = step_geometry(self.cfg, self.cache, self.replay, n, self.history_len)
        self.builder = MetadataBuilder(geometry, self.device)
        self.device_builder = DeviceMetadataBuilder(self.builder)
        self._drop_graphs()  # graphs read the cache's addresses: recaptured for a new cache
        if self.graph_recorder is not None:
            plan = self.graph_plan
            self.graphs = DecodeGraphs(self.builder, self.last_is_consumer, self.run_step, self.vocab_size,
                                       self.graph_recorder, self.graph_buckets,
                                       max_backtrack=self.max_backtrack,
                                       verify_tokens=plan.verify_tokens if plan else None)
            self.split_graphs = SplitGraphs(self.device_builder, self.graphs, self.run_step)
            if self.dspark is not None:
                self.dspark.graphs = DraftGraphs(self.dspark, self.cache, self.graph_recorder,
                                                 self.graph_buckets)
            if plan is not None:
                plan.capture(self.graphs, self.dspark.graphs if self.dspark else None, self.graph_recorder)

    def plan_graphs(self, max_num_seqs: int, num_draft_tokens: int, max_model_len: int, *,
                    measure_memory: bool = True) -> int:
        """Have every later `allocate_cache` capture its graphs ahead: decode steps of up to
        `max_num_seqs` sequences at table widths up to `max_model_len`'s and, with `num_draft_tokens`
        (0: no speculation), verification steps of 1 + that many tokens and the draft forward. Returns
        the device bytes the graphs will take (to keep out of the cache budget; 0 without graphs),
        measured on a throwaway cache; `measure_memory=False` (a cache size fixed by the user) skips
        that probe and returns 0."""
        if self.graph_recorder is None:
            return 0
        plan = GraphPlan(max_num_seqs, 1 + num_draft_tokens if num_draft_tokens else None, max_model_len,
                         buckets=self.graph_buckets)
        if not measure_memory:
            self.graph_plan = plan
            return 0
        self.graph_plan = None  # the probe's cache captures nothing
        self.allocate_cache(num_blocks=2, num_slots=2)
        reserve = probe_graph_memory(plan, self.builder, self.last_is_consumer, self.run_step,
                                     self.vocab_size, self.dspark, self.cache)
        self.cache = self.builder = self.device_builder = self.history = None
        self._drop_graphs()
        self.graph_plan = replace(plan, reserve=reserve)
        return reserve

    def _drop_graphs(self) -> None:
        """Forget every graph set (decode, split, draft): they read the addresses of the cache they were
        made for."""
        self.graphs = self.split_graphs = None
        if self.dspark is not None:
            self.dspark.graphs = None

    def reset_slot(self, slot: int) -> None:
        self._require_cache().reset_slot(slot)
        if self.history is not None:
            self.history[slot].zero_()

    def copy_slot(self, src: int, dst: int) -> None:
        self._require_cache().copy_slot(src, dst)
        if self.history is not None:
            self.history[dst] = self.history[src]

    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        self._require_cache().copy_blocks(src, dst)

    def _require_cache(self) -> KVCache:
        if self.cache is None:
            raise RuntimeError("allocate_cache() must be called before forward()")
        return self.cache

    # --- forward

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        self._require_cache()
        segs = batch.segments
        keep = self.replay.keep
        if self.replay.mode == "compact" and any(s.logits == "all" and len(s.token_ids) > keep for s in segs):
            raise ValueError(
                f"compact bounded replay computes only the last {keep} rows of a segment: "
                "logits='all' is not available for longer segments"
            )
        if self.graphs is not None and (out := self.graphs.forward(batch)) is not None:
            return out
        meta = self.builder.build(batch, self.last_is_consumer)
        return ForwardOutput(logits=self.run_step(meta, batch.input_ids), row_offsets=meta.row_offsets)

    def device_rows_fit(self, segments: Sequence[SequenceSegment]) -> bool:
        """Whether `forward_rows` can run these segments (short ones with logits for every token)."""
        return self.device_builder is not None and self.device_builder.fits(segments)

    def forward_rows(self, batch: ForwardBatch, rows: torch.Tensor, total: int) -> torch.Tensor:
        """Logits [total, V] of the segments cut to their first rows[b] tokens, `rows` on the device
        (summing to `total`): metadata built there (device_metadata.py), through a CUDA graph of the
        step's shape (split_graphs.py) or eagerly; batch.input_ids (if given) are the uncut segments' ids."""
        self._require_cache()
        planned = sum(len(s.token_ids) for s in batch.segments)
        if batch.input_ids is not None and batch.input_ids.shape != (planned,):
            raise ValueError(f"input_ids has shape {tuple(batch.input_ids.shape)}, the (uncut) segments hold "
                             f"{planned} tokens")
        graphed = self.split_graphs.forward(batch, rows, total) if self.split_graphs is not None else None
        if graphed is not None:
            return graphed
        meta = self.device_builder.build(batch.segments, rows, total, batch.input_ids)
        return self.run_step(meta, None)

    def run_step(self, meta: StepMetadata, input_ids: torch.Tensor | None) -> torch.Tensor:
        """The device work of a step (what a CUDA graph records): token ids (the engine's device ids,
        or the metadata's) -> the model, Engram history and DSpark context updates -> float32 logits."""
        cache = self._require_cache()
        self.model.ops.plan(meta)
        ids = input_ids if input_ids is not None else meta.input_ids
        if ids.shape != (meta.num_rows,):
            raise ValueError(
                f"input_ids has shape {tuple(ids.shape)}, the segments hold {meta.num_rows} tokens"
            )
        ids = ids.to(self.device, torch.int64)
        engram = self.model.hasher is not None
        inputs = TokenInputs(ids=ids, ngrams=self._ngrams(ids, meta) if engram else None)
        step = StepState(self.cfg, cache, meta)
        out = self.model.forward(inputs, step)
        if engram:
            self.history.view(-1).index_put_((meta.history_dest,), ids[meta.history_src])

        if self.dspark is not None and out.target_features is not None:
            self.dspark.write_context(cache, step.rows(self.model.blocks[-1].spec), out.target_features)
        return self.model.logits(out.hidden[meta.logits_rows])

    def _ngrams(self, ids: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        """Engram n-gram rows [T, N] (compressed ids): shift i is the token i positions back, read from
        this step's ids or the slot's history ring; before the sequence start, the pad id."""
        hasher = self.model.hasher
        src = meta.engram_sources
        tokens = torch.cat((self.history.view(-1), ids))[src.clamp_min(0)]
        # image tokens would block the look-back too; this runtime has no vision tower, so there are none
        comp = hasher.token_map[tokens.clamp(0, hasher.token_map.numel() - 1)]
        return torch.where(src >= 0, comp, hasher.pad_id)

    # --- full-sequence scoring

    def score(self, prompts: Sequence[Sequence[int]], chunk: int | None = None) -> list[torch.Tensor]:
        """fp32 logits [len, vocab] of every position of each prompt (fresh cache, slot 1)."""
        block = self.cache_layout().block_size
        longest = max(len(p) for p in prompts)
        blocks = -(-longest // block)
        self.allocate_cache(blocks + 1, 2)
        table = list(range(1, blocks + 1))
        results = []
        for prompt in prompts:
            self.reset_slot(1)
            step = chunk or len(prompt)
            parts = []
            for start in range(0, len(prompt), step):
                seg = SequenceSegment(1, table, start, list(prompt[start : start + step]), logits="all")
                parts.append(self.forward(ForwardBatch([seg])).logits)
            results.append(torch.cat(parts))
        return results


def build_runtime(
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype = torch.float32,
    ops: Ops | None = None,
    engram_token_map: Sequence[int] | None = None,
    options: RuntimeOptions | None = None,
) -> DeepseekV41Runtime:
    """A runtime over already-loaded tensors (storage dtypes, on the target device)."""
    device = next(iter(tensors.values())).device
    options = options or RuntimeOptions()
    ops = ops or get_ops(device=device, batch_invariant=options.batch_invariant)
    if options.batch_invariant and not ops.batch_invariant:
        raise ValueError("RuntimeOptions.batch_invariant needs ops from get_ops(..., batch_invariant=True)")
    cfg = config.text
    model = DeepseekV41Model(cfg, tensors, Attention, ops, dtype, engram_token_map)
    dspark = DSpark(cfg, tensors, model, Attention) if cfg.has_dspark else None
    return DeepseekV41Runtime(model, dspark, options or RuntimeOptions())


def load_runtime(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    backend: str | None = None,
    options: RuntimeOptions | None = None,
    load_format: str = "auto",
    seed: int = 0,
) -> DeepseekV41Runtime:
    """Load a release-format checkpoint directory (config.json, tokenizer.json, safetensors); with
    `load_format="dummy"`, random weights drawn from `seed` instead of the safetensors, and without
    tokenizer.json a stand-in Engram token map."""
    model_dir = Path(model_dir)
    config = load_model_config(model_dir / "config.json")
    tokenizer_file = model_dir / "tokenizer.json"
    if load_format == "dummy":
        tensors = random_weights(config, device, seed)
    else:
        tensors = load_checkpoint(model_dir, config, progress=False).tensors
        if torch.device(device).type != "cpu":
            tensors = {name: t.to(device) for name, t in tensors.items()}
    token_map = None
    if config.text.has_engram:
        token_map = (dummy_token_map(config) if load_format == "dummy" and not tokenizer_file.exists()
                     else compressed_vocab(Tokenizer.from_file(str(tokenizer_file))).token_map)
    ops = get_ops(backend, device, batch_invariant=options is not None and options.batch_invariant)
    return build_runtime(config, tensors, dtype=dtype, ops=ops, engram_token_map=token_map, options=options)
