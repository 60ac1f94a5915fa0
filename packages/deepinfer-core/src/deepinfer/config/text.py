"""`text_config` of a DeepSeek-V4.1 config.json: typed fields named exactly like the HF keys.

Field-level rules (types, ranges, fixed values) are pydantic constraints; cross-field rules live in
`_check_rules` and the sharing topology in `topology.py`. Every rule message starts with the key it is
about. Keys the spec does not know are kept (`extra="allow"`) so `to_hf_dict` round-trips a real file.
"""

from __future__ import annotations

from functools import cached_property
from itertools import pairwise
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deepinfer.config.engram_hash import engram_table_rows
from deepinfer.config.errors import config_error_from

if TYPE_CHECKING:
    from deepinfer.config.topology import LayerSpec

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
VALID_COMPRESS_RATIOS = (0, 1, 2)
CANDIDATE_BLOCK_SIZES = (8, 16)


class RopeScaling(BaseModel):
    """YaRN frequency ramp for compressed layers (no magnitude scaling, spec §6.3)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    rope_type: Literal["yarn"]
    factor: float = Field(gt=0)
    beta_fast: float = Field(gt=0)
    beta_slow: float = Field(gt=0)
    original_max_position_embeddings: PosInt

    @model_validator(mode="after")
    def _betas(self) -> RopeScaling:
        if self.beta_fast <= self.beta_slow:
            raise ValueError(f"beta_fast: must exceed beta_slow ({self.beta_fast} <= {self.beta_slow})")
        return self


class TextConfig(BaseModel):
    # Infinity/NaN (which Python's json accepts) would validate every `gt=0` rule and poison the model
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    # --- widths
    vocab_size: PosInt
    hidden_size: PosInt
    num_hidden_layers: PosInt
    num_attention_heads: PosInt
    num_key_value_heads: Literal[1]
    head_dim: PosInt
    qk_rope_head_dim: PosInt
    q_lora_rank: PosInt
    o_lora_rank: PosInt
    o_groups: PosInt
    hidden_act: Literal["silu"]
    swiglu_limit: float = Field(gt=0)
    rms_norm_eps: float = Field(gt=0)
    attention_bias: Literal[False]
    attention_dropout: Literal[0.0]
    initializer_range: float = 0.02
    max_position_embeddings: PosInt
    # --- rotary
    rope_theta: float = Field(gt=0)
    rope_scaling: RopeScaling
    compress_rope_theta: float = Field(gt=0)
    # --- MoE
    moe_intermediate_size: PosInt
    n_routed_experts: PosInt
    n_shared_experts: Literal[1]
    num_experts_per_tok: PosInt
    scoring_func: Literal["sqrtsoftplus"]
    topk_method: Literal["noaux_tc"]
    norm_topk_prob: Literal[True]
    routed_scaling_factor: float = Field(gt=0)
    # --- attention schedule and sharing
    sliding_window: PosInt
    compress_ratios: list[int]
    kv_source_layer_ids: list[int]
    index_source_layer_ids: list[int]
    index_k_source_layer_ids: list[int] | None = None  # None: same as kv_source_layer_ids
    index_n_heads: PosInt
    index_head_dim: PosInt
    index_topk: PosInt
    candidate_source_layer_id: int | None = None  # None or -1: no candidate blocks
    candidate_topk_blocks: PosInt
    candidate_block_size: PosInt
    use_fp4_sparse_kv: bool = True
    # --- mHC
    hc_mult: PosInt
    hc_sinkhorn_iters: PosInt
    hc_eps: float = Field(gt=0)
    hc_shifted: bool = True
    # --- Engram (absent / empty engram_layer_ids: no Engram)
    engram_layer_ids: list[int] = Field(default_factory=list)
    engram_num_embeddings: list[int] | None = None
    # bounded: validation searches layers x (max_ngram - 1) x heads hash primes above engram_vocab_size
    # (a hostile 2**31 heads never finished); the prime test is deterministic below 3.3e24
    engram_max_ngram_size: int | None = Field(default=None, ge=2, le=16)
    engram_vocab_size: int | None = Field(default=None, gt=0, le=2**48)
    engram_n_heads: int | None = Field(default=None, gt=0, le=256)
    engram_head_dim: int | None = Field(default=None, gt=0)
    engram_pad_token_id: int | None = Field(default=None, ge=0)
    engram_compressed_vocab_size: int | None = Field(default=None, gt=0)
    # --- DSpark draft blocks
    num_nextn_predict_layers: NonNegInt
    dspark_block_size: int | None = Field(default=None, gt=0)
    dspark_noise_token_id: int | None = Field(default=None, ge=0)
    dspark_target_layer_ids: list[int] | None = None
    dspark_markov_rank: int | None = Field(default=None, gt=0)
    dspark_n_routed_experts: int | None = Field(default=None, gt=0)
    dspark_num_experts_per_tok: int | None = Field(default=None, gt=0)
    dspark_target_attn_input: Literal[True] = True
    # --- misc
    tie_word_embeddings: Literal[False] = False
    pad_token_id: Literal[2] = 2
    bos_token_id: Literal[0] = 0
    eos_token_id: Literal[1] = 1
    dtype: Literal["bfloat16"] = "bfloat16"

    @classmethod
    def from_hf(cls, data: dict[str, Any]) -> TextConfig:
        """Parse an HF `text_config` dict; any violation raises ConfigError naming the key."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise config_error_from(exc, "text_config") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """The keys as they would appear in config.json (defaults that were never given stay absent)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> TextConfig:
        """A re-validated copy (pydantic's plain copy would keep stale derived values such as `layers`)."""
        return TextConfig.from_hf({**self.to_hf_dict(), **(update or {})})

    @model_validator(mode="after")
    def _check(self) -> TextConfig:
        _check_rules(self)
        _ = self.layers  # builds and validates the sharing topology
        return self

    # --- derived values
    @property
    def kv_lora_rank(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def num_layers_total(self) -> int:
        """Backbone layers plus DSpark blocks (= len(compress_ratios))."""
        return self.num_hidden_layers + self.num_nextn_predict_layers

    @property
    def index_k_sources(self) -> list[int]:
        if self.index_k_source_layer_ids is None:
            return list(self.kv_source_layer_ids)
        return self.index_k_source_layer_ids

    @property
    def candidate_source(self) -> int | None:
        """Candidate-block source layer, or None when disabled (null or -1 in the file)."""
        cid = self.candidate_source_layer_id
        return None if cid is None or cid < 0 else cid

    @property
    def has_engram(self) -> bool:
        return bool(self.engram_layer_ids)

    @property
    def has_dspark(self) -> bool:
        return self.num_nextn_predict_layers > 0

    @property
    def n_prefill_layer(self) -> int:
        """First ratio-1 backbone layer = start of the YOCO consumer half (num_hidden_layers if none)."""
        for i, r in enumerate(self.compress_ratios[: self.num_hidden_layers]):
            if r == 1:
                return i
        return self.num_hidden_layers

    @cached_property
    def engram_rows(self) -> list[int]:
        """Table rows per Engram layer (sum of that layer's hash primes)."""
        if not self.has_engram:
            return []
        return engram_table_rows(
            self.engram_layer_ids, self.engram_max_ngram_size, self.engram_n_heads, self.engram_vocab_size
        )

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        """One LayerSpec per backbone layer, then one per DSpark block."""
        from deepinfer.config.topology import topology

        return topology(self)


def _require(cfg: TextConfig, keys: list[str], why: str) -> None:
    for key in keys:
        if getattr(cfg, key) is None:
            raise ValueError(f"{key}: required when {why}")


def check_layer_ids(key: str, ids: list[int], upper: int, what: str) -> None:
    """Layer-id lists must be strictly increasing and inside [0, upper)."""
    if any(b <= a for a, b in pairwise(ids)):
        raise ValueError(f"{key}: must be strictly increasing, got {ids}")
    bad = [i for i in ids if not 0 <= i < upper]
    if bad:
        raise ValueError(f"{key}: {bad} outside [0, {upper}) ({what})")


def _check_rules(c: TextConfig) -> None:
    """Cross-field rules that do not involve the sharing segments (those are in topology.py)."""
    L = c.num_hidden_layers
    if c.qk_rope_head_dim % 2 or c.qk_rope_head_dim >= c.head_dim:
        raise ValueError(
            f"qk_rope_head_dim: must be even and smaller than head_dim ({c.qk_rope_head_dim} vs "
            f"{c.head_dim}); head_dim - qk_rope_head_dim is the latent width kv_lora_rank"
        )
    if c.qk_rope_head_dim >= c.index_head_dim:
        raise ValueError(f"index_head_dim: must exceed qk_rope_head_dim ({c.index_head_dim})")
    if c.num_attention_heads % c.o_groups:
        raise ValueError(f"o_groups: must divide num_attention_heads {c.num_attention_heads}")
    for key in ("hidden_size", "moe_intermediate_size"):
        if getattr(c, key) % 32:
            raise ValueError(f"{key}: must be a multiple of 32 (FP4 experts carry one scale per 32 inputs)")
    if c.num_experts_per_tok > c.n_routed_experts:
        raise ValueError(f"num_experts_per_tok: exceeds n_routed_experts {c.n_routed_experts}")
    if c.rope_scaling.original_max_position_embeddings > c.max_position_embeddings:
        raise ValueError("rope_scaling: original_max_position_embeddings exceeds max_position_embeddings")

    total = L + c.num_nextn_predict_layers
    if len(c.compress_ratios) != total:
        raise ValueError(
            f"compress_ratios: needs num_hidden_layers + num_nextn_predict_layers = {total} entries, "
            f"got {len(c.compress_ratios)}"
        )
    bad = sorted({r for r in c.compress_ratios if r not in VALID_COMPRESS_RATIOS})
    if bad:
        raise ValueError(f"compress_ratios: values {bad} not in {{0, 1, 2}} (C4/C128 are V4-only)")
    if any(c.compress_ratios[L:]):
        raise ValueError("compress_ratios: DSpark entries (after num_hidden_layers) must be 0")

    if c.candidate_source is not None:
        if c.candidate_block_size not in CANDIDATE_BLOCK_SIZES:
            raise ValueError(f"candidate_block_size: must be 8 or 16, got {c.candidate_block_size}")
        if c.candidate_topk_blocks % 8:
            raise ValueError(f"candidate_topk_blocks: must be a multiple of 8, got {c.candidate_topk_blocks}")
        capacity = c.candidate_topk_blocks * c.candidate_block_size
        if c.index_topk > capacity:
            raise ValueError(
                f"index_topk: {c.index_topk} exceeds candidate capacity candidate_topk_blocks * "
                f"candidate_block_size = {capacity}"
            )

    _check_engram(c)
    _check_dspark(c)


def _check_engram(c: TextConfig) -> None:
    if not c.engram_layer_ids:
        return
    L = c.num_hidden_layers
    check_layer_ids("engram_layer_ids", c.engram_layer_ids, L, "backbone layers")
    _require(
        c,
        [
            "engram_max_ngram_size",
            "engram_vocab_size",
            "engram_n_heads",
            "engram_head_dim",
            "engram_pad_token_id",
            "engram_compressed_vocab_size",
        ],
        "engram_layer_ids is non-empty",
    )
    consumers = [i for i in c.engram_layer_ids if i >= c.n_prefill_layer]
    if consumers:
        raise ValueError(
            f"engram_layer_ids: layers {consumers} lie in the YOCO consumer half (>= n_prefill_layer "
            f"{c.n_prefill_layer}); Engram layers must be producers"
        )
    if c.engram_head_dim % 32:
        raise ValueError("engram_head_dim: must be a multiple of 32 (one UE8M0 scale per 32 columns)")
    if c.engram_pad_token_id >= c.vocab_size:
        raise ValueError(f"engram_pad_token_id: {c.engram_pad_token_id} >= vocab_size {c.vocab_size}")
    if c.engram_compressed_vocab_size > c.vocab_size:
        raise ValueError("engram_compressed_vocab_size: exceeds vocab_size")
    if c.engram_num_embeddings is not None and list(c.engram_num_embeddings) != c.engram_rows:
        raise ValueError(
            f"engram_num_embeddings: must equal the per-layer sums of the hash primes {c.engram_rows}, "
            f"got {c.engram_num_embeddings}"
        )


def _check_dspark(c: TextConfig) -> None:
    if not c.has_dspark:
        return
    L = c.num_hidden_layers
    _require(
        c,
        [
            "dspark_block_size",
            "dspark_noise_token_id",
            "dspark_target_layer_ids",
            "dspark_markov_rank",
            "dspark_n_routed_experts",
            "dspark_num_experts_per_tok",
        ],
        "num_nextn_predict_layers > 0",
    )
    if not c.dspark_target_layer_ids:
        raise ValueError("dspark_target_layer_ids: must list at least one backbone layer")
    check_layer_ids("dspark_target_layer_ids", c.dspark_target_layer_ids, L, "backbone layers")
    sides = {i >= c.n_prefill_layer for i in c.dspark_target_layer_ids}
    if len(sides) > 1:
        raise ValueError(
            f"dspark_target_layer_ids: {c.dspark_target_layer_ids} straddle the YOCO boundary "
            f"(n_prefill_layer {c.n_prefill_layer}); all targets must lie on one side"
        )
    if c.dspark_noise_token_id >= c.vocab_size:
        raise ValueError(f"dspark_noise_token_id: {c.dspark_noise_token_id} >= vocab_size {c.vocab_size}")
    if c.dspark_num_experts_per_tok > c.dspark_n_routed_experts:
        raise ValueError("dspark_num_experts_per_tok: exceeds dspark_n_routed_experts")


__all__ = ["CANDIDATE_BLOCK_SIZES", "VALID_COMPRESS_RATIOS", "RopeScaling", "TextConfig"]
