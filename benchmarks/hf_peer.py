"""HF transformers' DeepSeek-V4 at Flash widths: the same-run peer of reference_forward.py.

Builds a transformers `DeepseekV4ForCausalLM` slice with random weights straight on the device (bf16; all
widths of V4.1-Flash: H 5120, 64 heads x 512, q rank 1280, O-proj 8 x 1024, 384 routed experts top-6 + 1
shared at 2304, indexer 32 x 128 top-512) and measures, per batch size: prefill tok/s, decode ms/step with
the model's own KV cache (`use_cache=True`), time per layer (attention and MoE, synchronising hooks as in
reference_forward.py), peak memory; plus the weight bytes per layer and the machine's copy bandwidth and
bf16 matmul rate in the same run. Needs only torch and transformers (>= 5.17, which has DeepSeek-V4).

    python benchmarks/hf_peer.py [--layers 5 --prefill 2048 --decode 8 --batch 1,64 --json out.json]
    python benchmarks/hf_peer.py --tiny --device cpu        # small widths, for checking the script

Prompts larger than --prefill-chunk tokens in total are prefilled in chunks (eager attention materialises
a [batch, 64, queries, keys] score tensor). Decode is timed twice after one untimed step: plain (`decode_s`,
the headline) and with the per-layer hooks (`decode_timed_s`, broken down in `decode_layer_ms_per_step`).

Memory on one H200 (139.8 GiB): the 5-layer slice's dense bf16 weights take 130.7 GiB; batch 1 at 2048
tokens peaks at 134.1 GiB. Batch 64 at 2048 tokens does not fit beside them: eager attention copies the one
K=V head out to all 64 heads (~8.6 GiB each for K and V per layer call at batch 64), so a batch size that
runs out of memory is recorded as an error and the others still report. Measure batch 64 per layer with
fewer layers: `--layers 3 --batch 64` (weights 79.4 GiB).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import transformers
from machine_peaks import machine_peaks
from torch import nn
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4CSACompressor

FLASH_WIDTHS: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 5120,
    "num_attention_heads": 64,
    "head_dim": 512,
    "partial_rotary_factor": 64 / 512,
    "q_lora_rank": 1280,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "n_routed_experts": 384,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2304,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "sliding_window": 128,
}
TINY_WIDTHS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "head_dim": 32,
    "partial_rotary_factor": 8 / 32,
    "q_lora_rank": 32,
    "o_groups": 2,
    "o_lora_rank": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "index_n_heads": 4,
    "index_head_dim": 16,
    "index_topk": 8,
    "sliding_window": 8,
}
V41_SHARED: dict[str, Any] = {  # values V4.1-Flash shares with V4 (model spec §2, §6.3, §8)
    "num_key_value_heads": 1,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 1048576,
}
DIFFERENCES = (
    "layer kinds: transformers has SWA, CSA (compressor + indexer) and HCA (no indexer); our slice "
    "[SWA+Engram, Full C2, Full C1, Reindex C1, Reuse C1] maps to [SWA, CSA r2, CSA r1, CSA r1, CSA r1]",
    "one compression rate per layer type in the transformers config: layers with another ratio get their "
    "compressor rebuilt at that ratio and their cache layer's rate set after construction",
    "no Engram (layer 0 does no n-gram lookup or gate)",
    "no cross-layer sharing (Reindex/Reuse, YOCO, candidate blocks): every compressed layer owns its "
    "compressor and indexer, so layers 3-4 project and score more than our Reindex/Reuse layers",
    "V4 compressor: overlapping windows of 2 x ratio tokens (2 x 512-wide kv and gate projections) and "
    "indexer keys from an indexer compressor of their own; V4.1 pools disjoint groups (ratio 1: no gate) "
    "and derives index keys from the compressed latent",
    "V4 details kept: per-head RMSNorm on q, V4 mHC (not V4.1's shifted single pass)",
    "attention is eager only (transformers disables SDPA/flash for head_dim 512 with sinks): a dense masked "
    "softmax over the window plus all compressed entries; the indexer's top-512 only masks scores",
    "routed experts are dense bf16 (no FP4), run by the transformers default experts implementation",
    "caches in bf16 (like our exact precision), no FP8/FP4 cache formats",
    "no DSpark block (transformers does not instantiate the MTP layers): dspark_draft_ms is null",
    "every parameter in bf16: transformers' load-time list of fp32 modules (mHC, norms, sinks, biases) "
    "breaks its own eager forward with mixed dtypes when applied here",
)
MXFP4_BYTES_PER_PARAM = 0.5 + 1 / 32  # E2M1 nibble + one E8M0 scale byte per 32 values


def slice_ratios(num_layers: int) -> list[int]:
    """Compression ratio per layer, as in our Flash slice (0 = sliding window only)."""
    return ([0, 2, 1, 1] + [1] * num_layers)[:num_layers]


def kind(ratio: int) -> str:
    return "SWA" if ratio == 0 else f"CSA r{ratio}"


def build_config(widths: dict[str, Any], ratios: list[int]) -> DeepseekV4Config:
    csa_rate = min(r for r in ratios if r) if any(ratios) else 1
    return DeepseekV4Config(
        **widths,
        **copy.deepcopy(V41_SHARED),
        num_hidden_layers=len(ratios),
        layer_types=["compressed_sparse_attention" if r else "sliding_attention" for r in ratios],
        compress_rates={"compressed_sparse_attention": csa_rate, "heavily_compressed_attention": 128},
        mlp_layer_types=["moe"] * len(ratios),  # V4.1 has no hash-routed layers
    )


def _with_rate(config: DeepseekV4Config, ratio: int) -> DeepseekV4Config:
    other = copy.deepcopy(config)
    other.compress_rates = {**config.compress_rates, "compressed_sparse_attention": ratio}
    return other


def build_model(config: DeepseekV4Config, ratios: list[int], device: torch.device) -> DeepseekV4ForCausalLM:
    with torch.device(device):
        model = DeepseekV4ForCausalLM._from_config(config, dtype=torch.bfloat16)
        base = config.compress_rates["compressed_sparse_attention"]
        for layer, ratio in zip(model.model.layers, ratios):
            if ratio and ratio != base:
                compressor = DeepseekV4CSACompressor(_with_rate(config, ratio))
                compressor.apply(model._init_weights)
                for p in compressor.parameters():  # rotary buffers stay fp32, as in the model
                    p.data = p.data.to(torch.bfloat16)
                layer.self_attn.compressor = compressor
    return model.eval()


def new_cache(model: DeepseekV4ForCausalLM, ratios: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    for layer, ratio in zip(cache.layers, ratios):
        if ratio:
            layer.compress_rate = ratio
    return cache


def _gib(module: nn.Module) -> float:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30


def weight_table(model: DeepseekV4ForCausalLM, ratios: list[int]) -> list[dict[str, Any]]:
    rows = []
    for i, (layer, ratio) in enumerate(zip(model.model.layers, ratios)):
        experts = layer.mlp.experts
        params = sum(p.numel() for p in experts.parameters())
        rows.append(
            {
                "layer": f"L{i} {kind(ratio)}",
                "gib": _gib(layer),
                "attention_gib": _gib(layer.self_attn),
                "routed_experts_gib": _gib(experts),
                "routed_experts_dtype": str(experts.gate_up_proj.dtype).removeprefix("torch."),
                "routed_experts_mxfp4_gib": params * MXFP4_BYTES_PER_PARAM / 2**30,
            }
        )
    return rows


class LayerTimer:
    """Forward hooks around each layer's attention and MoE: synchronise, then add up wall time per label."""

    def __init__(self, model: DeepseekV4ForCausalLM, ratios: list[int], device: torch.device) -> None:
        self.device = device
        self.enabled = False
        self.ms: dict[str, float] = defaultdict(float)
        self._start: dict[str, float] = {}
        for i, (layer, ratio) in enumerate(zip(model.model.layers, ratios)):
            for module, part in ((layer.self_attn, "attention"), (layer.mlp, "MoE")):
                label = f"L{i} {kind(ratio)}: {part}"
                module.register_forward_pre_hook(self._before(label))
                module.register_forward_hook(self._after(label))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _before(self, label: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            if self.enabled:
                self._sync()
                self._start[label] = time.perf_counter()

        return hook

    def _after(self, label: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.enabled:
                self._sync()
                self.ms[label] += (time.perf_counter() - self._start[label]) * 1e3

        return hook

    def take(self) -> dict[str, float]:
        out, self.ms = dict(self.ms), defaultdict(float)
        return out


def run(
    model: DeepseekV4ForCausalLM,
    ratios: list[int],
    timer: LayerTimer,
    batch: int,
    prefill: int,
    decode: int,
    chunk_tokens: int,
) -> dict[str, Any]:
    device = timer.device
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, model.config.vocab_size, (batch, prefill), generator=gen).to(device)
    chunk = max(1, min(prefill, chunk_tokens // batch))

    def last_logits(ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]

    def decode_steps(nxt: torch.Tensor, cache: DynamicCache) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        for _ in range(decode):
            nxt = last_logits(nxt, cache).argmax(-1, keepdim=True)
        timer._sync()
        return nxt, time.perf_counter() - t0

    # warm-up (allocator, kernel selection) on a short prompt and one decode step, then the measured runs
    warm = new_cache(model, ratios)
    last_logits(last_logits(prompts[:, :16], warm).argmax(-1, keepdim=True), warm)
    del warm
    cache = new_cache(model, ratios)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timer._sync()
    timer.enabled = True
    t0 = time.perf_counter()
    for start in range(0, prefill, chunk):
        logits = last_logits(prompts[:, start : start + chunk], cache)
    timer._sync()
    prefill_s = time.perf_counter() - t0
    prefill_layers = timer.take()
    timer.enabled = False
    # one untimed step at the decode shapes, which pays first-call allocator and kernel-selection costs (on
    # the H200 without it, the first 8 steps after prefill averaged 40.5 ms, the next 8, hooked, 36.3 ms)
    nxt = last_logits(logits.argmax(-1, keepdim=True), cache).argmax(-1, keepdim=True)
    nxt, decode_s = decode_steps(nxt, cache)
    timer.enabled = True
    _, decode_timed_s = decode_steps(nxt, cache)
    timer.enabled = False
    decode_layers = timer.take()
    steps = max(decode, 1)
    result = {
        "batch": batch,
        "prefill_tokens": prefill * batch,
        "prefill_chunk": chunk,
        "prefill_s": prefill_s,
        "prefill_tok_s": prefill * batch / prefill_s,
        "decode_steps": decode,
        "decode_s": decode_s,
        "decode_ms_per_step": decode_s * 1e3 / steps,
        "decode_tok_s": decode * batch / decode_s if decode else None,
        "decode_timed_s": decode_timed_s,
        "prefill_layer_ms": prefill_layers,
        "prefill_other_ms": prefill_s * 1e3 - sum(prefill_layers.values()),  # embedding, mHC, norms, head
        "decode_layer_ms_per_step": {k: v / steps for k, v in decode_layers.items()},
        "decode_other_ms_per_step": (decode_timed_s * 1e3 - sum(decode_layers.values())) / steps,
        "dspark_draft_ms": None,
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def run_summary(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"batch {r['batch']}: {r['error']}"
    decode = "-"
    if r["decode_steps"]:
        decode = f"{r['decode_ms_per_step']:.2f} ms/step ({r['decode_tok_s']:.1f} tok/s)"
    peak = f", peak {r['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in r else ""
    prompt = f"{r['batch']} x {r['prefill_tokens'] // r['batch']} tokens (chunks of {r['prefill_chunk']})"
    return (
        f"batch {r['batch']}: prefill {prompt} {r['prefill_s']:.3f} s = {r['prefill_tok_s']:.0f} tok/s; "
        f"decode {decode}{peak}"
    )


def print_tables(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(f"\n{result['what']}: transformers {result['transformers']}")
    print(f"attention {result['attn_implementation']}, experts {result['experts_implementation']}, ", end="")
    print(f"routed experts {result['expert_storage']}")
    print(f"machine: copy {m['copy_gb_s']:.0f} GB/s, bf16 matmul {m['bf16_matmul_tflop_s']:.1f} TFLOP/s")
    print(f"{'weights':<12} {'GiB':>9} {'experts GiB':>12} {'as MXFP4':>9}")
    for w in result["weights_per_layer"]:
        gib, experts, fp4 = w["gib"], w["routed_experts_gib"], w["routed_experts_mxfp4_gib"]
        print(f"{w['layer']:<12} {gib:9.3f} {experts:12.3f} {fp4:9.3f}")
    for r in result["runs"]:
        print(f"\n{run_summary(r)}")
        if "error" in r:
            continue
        print(f"{'ms':<26} {'prefill':>10} {'decode/step':>12}")
        for label, ms in r["prefill_layer_ms"].items():
            print(f"{label:<26} {ms:10.2f} {r['decode_layer_ms_per_step'].get(label, 0.0):12.2f}")
        rest = "rest (embed, mHC, head)"
        print(f"{rest:<26} {r['prefill_other_ms']:10.2f} {r['decode_other_ms_per_step']:12.2f}")


def _batches(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch wants comma-separated integers, got {text!r}") from None
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"--batch sizes must be >= 1, got {text!r}")
    return batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny widths (checking the script on a CPU)")
    p.add_argument("--layers", type=int, default=5, help="layers of the slice, kinds as in our Flash slice")
    p.add_argument("--batch", type=_batches, default=None, help="comma-separated batch sizes (default 1,64)")
    p.add_argument("--prefill", type=int, default=None, help="prompt tokens per sequence (default 2048)")
    p.add_argument("--decode", type=int, default=8, help="decode steps per timing")
    p.add_argument("--prefill-chunk", type=int, default=4096, help="most prompt tokens per forward, all rows")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    if args.layers < 1 or args.decode < 0 or args.prefill_chunk < 1:
        p.error("--layers and --prefill-chunk must be >= 1, --decode >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    widths = TINY_WIDTHS if args.tiny else FLASH_WIDTHS
    batches = args.batch or ([1, 4] if args.tiny else [1, 64])
    prefill = args.prefill or (64 if args.tiny else 2048)
    if prefill < 1:
        p.error("--prefill must be >= 1")

    peaks = machine_peaks(device)  # before the weights take the memory
    ratios = slice_ratios(args.layers)
    t0 = time.perf_counter()
    model = build_model(build_config(widths, ratios), ratios, device)
    build_s = time.perf_counter() - t0
    weights = weight_table(model, ratios)
    timer = LayerTimer(model, ratios, device)
    experts = model.model.layers[0].mlp.experts.gate_up_proj
    result: dict[str, Any] = {
        "what": f"transformers DeepSeek-V4, {'tiny' if args.tiny else 'Flash'} widths, {args.layers} layers "
        f"[{', '.join(kind(r) for r in ratios)}]",
        "device": str(device),
        "dtype": "bfloat16",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": model.config._experts_implementation,
        "expert_storage": f"dense {str(experts.dtype).removeprefix('torch.')} (no FP4)",
        "weights_gib": _gib(model),
        "weights_per_layer": weights,
        "build_s": build_s,
        "threads": torch.get_num_threads(),
        "machine": peaks,
        "differences": list(DIFFERENCES),
        "runs": [],
    }
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    with torch.inference_mode():
        for batch in batches:
            try:
                measured = run(model, ratios, timer, batch, prefill, args.decode, args.prefill_chunk)
            except torch.OutOfMemoryError as e:  # recorded, so that the other batch sizes still report
                measured = {"batch": batch, "error": ". ".join(str(e).split(". ")[:2])}
                timer.enabled = False
                timer.take()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            result["runs"].append(measured)
            print(run_summary(measured))
            if args.json:  # keep what was measured if a later, larger batch fails
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    print_tables(result)


if __name__ == "__main__":
    main()
