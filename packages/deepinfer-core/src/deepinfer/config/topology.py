"""Per-layer roles and cross-layer sharing derived from a TextConfig (model spec §4, §5).

Three segmented maps send each compressed layer to the nearest source at or before it: the KV
source (owns compressor + compressed KV), the index-K source (owns indexer keys) and the top-k
source (computes the selection). Building them is also where the sharing rules are enforced.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from deepinfer.config.text import check_layer_ids

if TYPE_CHECKING:
    from deepinfer.config.text import TextConfig

Role = Literal["swa", "full", "reindex", "reuse", "dspark"]


@dataclass(frozen=True)
class LayerSpec:
    index: int  # position in compress_ratios: backbone layer id, or num_hidden_layers + DSpark block id
    compress_ratio: int
    role: Role
    kv_source: int | None  # layer owning the compressed KV this layer reads (None: window only)
    index_k_source: int | None  # layer owning the indexer keys
    topk_source: int | None  # layer computing the top-k selection this layer uses
    is_candidate_source: bool  # computes candidate blocks (two-level selection, §4.4)
    restricted_to_candidates: bool  # computes its own top-k, but only inside the candidate mask
    is_engram: bool
    is_yoco_consumer: bool  # backbone layer at or after n_prefill_layer
    is_dspark_target: bool
    rope_theta: float
    uses_yarn: bool
    dspark_block: int | None = None  # 0.. for DSpark blocks

    @property
    def prefix(self) -> str:
        """Checkpoint name prefix (`layers.{i}` or `mtp.{j}`)."""
        return f"mtp.{self.dspark_block}" if self.dspark_block is not None else f"layers.{self.index}"

    @property
    def owns_compressor(self) -> bool:
        return self.role == "full"

    @property
    def owns_index_keys(self) -> bool:
        return self.index_k_source == self.index and self.dspark_block is None

    @property
    def owns_indexer_query(self) -> bool:
        return self.topk_source == self.index and self.dspark_block is None


def _nearest_at_or_before(sources: list[int], layer: int) -> int | None:
    pos = bisect_right(sources, layer)
    return sources[pos - 1] if pos else None


def _check_sources(key: str, ids: list[int], ratios: list[int]) -> None:
    check_layer_ids(key, ids, len(ratios), "backbone layers")
    for i in ids:
        if ratios[i] == 0:
            raise ValueError(f"{key}: layer {i} has compress ratio 0 (a source must be compressed)")


def topology(c: TextConfig) -> tuple[LayerSpec, ...]:
    """Validate the sharing maps of `c` and return one LayerSpec per backbone layer and DSpark block."""
    L = c.num_hidden_layers
    ratios = list(c.compress_ratios[:L])
    kv, index_k, index = list(c.kv_source_layer_ids), list(c.index_k_sources), list(c.index_source_layer_ids)
    _check_sources("kv_source_layer_ids", kv, ratios)
    _check_sources("index_k_source_layer_ids", index_k, ratios)
    _check_sources("index_source_layer_ids", index, ratios)
    # nesting: each top-k segment inside one index-K segment inside one KV segment
    if missing := sorted(set(kv) - set(index_k)):
        raise ValueError(f"index_k_source_layer_ids: must contain every KV source, missing {missing}")
    if missing := sorted(set(index_k) - set(index)):
        raise ValueError(f"index_source_layer_ids: must contain every index-K source, missing {missing}")

    n_prefill = c.n_prefill_layer
    for i, r in enumerate(ratios):
        src = _nearest_at_or_before(kv, i)
        if r and src is None:
            raise ValueError(f"compress_ratios: layer {i} has ratio {r} but no KV source at or before it")
        if src is not None and src < n_prefill <= i:
            raise ValueError(
                f"kv_source_layer_ids: the segment of source {src} crosses the YOCO boundary at layer "
                f"{n_prefill} (n_prefill_layer); put a KV source at the boundary"
            )
        if src is not None and r != ratios[src]:
            raise ValueError(
                f"compress_ratios: layer {i} has ratio {r} but its KV source {src} has ratio "
                f"{ratios[src]} (mixed ratios inside a sharing segment)"
            )

    cand = c.candidate_source
    if cand is not None and cand not in index:
        raise ValueError(f"candidate_source_layer_id: layer {cand} is not in index_source_layer_ids")
    if cand is not None and cand not in kv:
        raise ValueError(f"candidate_source_layer_id: layer {cand} is not a KV source (must be a Full layer)")
    cand_kv = _nearest_at_or_before(kv, cand) if cand is not None else None

    engram, targets = set(c.engram_layer_ids), set(c.dspark_target_layer_ids or ())
    specs = []
    for i, r in enumerate(ratios):
        kv_src = _nearest_at_or_before(kv, i) if r else None
        topk_src = _nearest_at_or_before(index, i) if r else None
        if not r:
            role: Role = "swa"
        elif i in kv:
            role = "full"
        elif i in index:
            role = "reindex"
        else:
            role = "reuse"
        specs.append(
            LayerSpec(
                index=i,
                compress_ratio=r,
                role=role,
                kv_source=kv_src,
                index_k_source=_nearest_at_or_before(index_k, i) if r else None,
                topk_source=topk_src,
                is_candidate_source=i == cand,
                restricted_to_candidates=(
                    cand is not None and topk_src == i and i > cand and kv_src == cand_kv
                ),
                is_engram=i in engram,
                is_yoco_consumer=i >= n_prefill,
                is_dspark_target=i in targets,
                rope_theta=c.compress_rope_theta if r else c.rope_theta,
                uses_yarn=bool(r),
            )
        )
    for j in range(c.num_nextn_predict_layers):
        specs.append(
            LayerSpec(
                index=L + j,
                compress_ratio=0,
                role="dspark",
                kv_source=None,
                index_k_source=None,
                topk_source=None,
                is_candidate_source=False,
                restricted_to_candidates=False,
                is_engram=False,
                is_yoco_consumer=False,
                is_dspark_target=False,
                rope_theta=c.rope_theta,
                uses_yarn=False,
                dspark_block=j,
            )
        )
    return tuple(specs)
