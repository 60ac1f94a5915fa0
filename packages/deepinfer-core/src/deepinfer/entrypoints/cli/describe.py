"""`deepinfer describe`: load a checkpoint (config + every tensor) and summarise it."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from deepinfer.checkpoint import Checkpoint, load_checkpoint


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "describe",
        help="validate a checkpoint and print its layers, parameter bytes and load speed",
        description="Parse config.json, check every expected tensor's name, dtype and shape against the "
        "safetensors headers, load the weights (memory-mapped, NaN/Inf-checked) and print a summary: "
        "layers by kind, bytes per parameter class, load time and throughput.",
    )
    parser.add_argument("--model", required=True, type=Path, help="checkpoint directory")
    parser.add_argument("--no-check-values", action="store_true", help="skip the NaN/Inf scan of the data")
    parser.add_argument(
        "--materialize",
        action="store_true",
        help="copy every tensor into memory (reads every byte) instead of mapping it",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _layer_table(ck: Checkpoint) -> list[str]:
    t = ck.config.text
    kinds: dict[str, list[str]] = {}
    for s in t.layers:
        kind = s.role if s.role in ("swa", "dspark") else f"{s.role} C{s.compress_ratio}"
        tags = [
            tag
            for tag, on in (
                ("cand", s.is_candidate_source),
                ("restricted", s.restricted_to_candidates),
                ("engram", s.is_engram),
                ("target", s.is_dspark_target),
            )
            if on
        ]
        kinds.setdefault(kind, []).append(s.prefix.split(".")[-1] + (f"({','.join(tags)})" if tags else ""))
    lines = [f"{'layer kind':<14} {'count':>5}  layers"]
    lines += [f"{k:<14} {len(v):>5}  {' '.join(v)}" for k, v in kinds.items()]
    lines.append(f"YOCO consumer half starts at layer {t.n_prefill_layer} of {t.num_hidden_layers}")
    return lines


def _bytes_table(ck: Checkpoint) -> list[str]:
    size, count = Counter(), Counter()
    for name, spec in ck.specs.items():
        t = ck.tensors[name]
        size[spec.group] += t.numel() * t.element_size()
        count[spec.group] += 1
    total = sum(size.values())
    lines = [f"{'parameter class':<16} {'tensors':>8} {'MB':>12} {'share':>7}"]
    lines += [
        f"{g:<16} {count[g]:>8} {b / 1e6:>12.1f} {100 * b / total:>6.1f}%" for g, b in size.most_common()
    ]
    lines.append(f"{'total':<16} {sum(count.values()):>8} {total / 1e6:>12.1f}")
    return lines


def run(args: argparse.Namespace) -> int:
    ck = load_checkpoint(
        args.model,
        check_values=not args.no_check_values,
        materialize=args.materialize,
        progress=not args.quiet,
    )
    t = ck.config.text
    print(
        f"{ck.path}: {ck.config.architectures[0]}, hidden {t.hidden_size}, {t.num_hidden_layers} layers + "
        f"{t.num_nextn_predict_layers} DSpark blocks, {t.n_routed_experts} experts "
        f"(top {t.num_experts_per_tok}), "
        f"vocab {t.vocab_size}"
    )
    print()
    print("\n".join(_layer_table(ck)))
    print()
    print("\n".join(_bytes_table(ck)))
    if ck.ignored:
        print(f"\nignored tensors (not used by this config): {len(ck.ignored)}")
    s = ck.stats
    print(
        f"\nloaded {s.tensors} tensors, {s.bytes / 1e9:.3f} GB from {s.files} file(s) in {s.seconds:.2f} s "
        f"({s.gb_per_s:.2f} GB/s; headers and checks {s.header_seconds:.3f} s)"
    )
    return 0
