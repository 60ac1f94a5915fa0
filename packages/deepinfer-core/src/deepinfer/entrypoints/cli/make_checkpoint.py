"""`deepinfer make-checkpoint`: write a random-weight checkpoint in the release layout."""

from __future__ import annotations

import argparse
from pathlib import Path

from deepinfer.checkpoint import write_checkpoint
from deepinfer.checkpoint.writer import write_config_files
from deepinfer.config import ModelConfig, load_model_config
from deepinfer.testing import TINY_CONFIG_NAMES, flash_config_dict, flash_slice_config, tiny_config
from deepinfer.tokenizer.bundled import tokenizer_for


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-checkpoint",
        help="write a random-weight checkpoint (tiny, Flash slice or any config.json)",
        description="Generate seeded random weights for a DeepSeek-V4.1 config, quantise them exactly as "
        "the release does (FP8 E4M3 32x32 + UE8M0, FP4 E2M1 + UE8M0 per 32, Engram FP8 rows) and write "
        "config.json, tokenizer files, model.safetensors.index.json and shards. The same config and seed "
        "give byte-identical files. The weights are random: the model produces no meaningful text.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config names: " + ", ".join(TINY_CONFIG_NAMES) + " (tiny); flash_slice (full Flash widths, "
        "few layers; see --layers/--experts); flash (the full 510 GB model)\n"
        "examples:\n"
        "  deepinfer make-checkpoint --config full --out /tmp/tiny-full\n"
        "  deepinfer make-checkpoint --config flash_slice --layers 5 --config-only --out /tmp/slice  "
        "# then: deepinfer bench --model /tmp/slice --load-format dummy\n"
        "  deepinfer make-checkpoint --config flash_slice --layers 4 --experts 48 --out /tmp/flash-slice",
    )
    parser.add_argument(
        "--config",
        required=True,
        help="a tiny config name, flash_slice, flash, or a path to a "
        "config.json (or a directory containing one)",
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--shard-size-gb", type=float, default=5.0, help="target shard size in GB (default 5)"
    )
    parser.add_argument("--single-file", action="store_true", help="write one model.safetensors, no index")
    parser.add_argument("--config-only", action="store_true",
                        help="write config.json and the tokenizer files only, no weights: a model directory "
                        "for --load-format dummy (random weights generated in memory at load), instant even "
                        "for flash")
    slice_opts = parser.add_argument_group("flash_slice options")
    slice_opts.add_argument(
        "--layers",
        type=int,
        default=4,
        help="backbone layers of the slice (default 4: "
        "SWA+Engram, Full C2, Full C1 with candidates, Reindex; more layers are Reuse)",
    )
    slice_opts.add_argument(
        "--experts", type=int, default=None, help="routed experts per layer (default 384)"
    )
    slice_opts.add_argument(
        "--dspark-experts", type=int, default=None, help="DSpark routed experts (default 128)"
    )
    slice_opts.add_argument(
        "--engram-vocab",
        type=int,
        default=100_000,
        help="engram_vocab_size, which sets the "
        "Engram table rows (default 100000; Flash uses 16M = 100 GB per table)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def resolve_config(args: argparse.Namespace) -> ModelConfig:
    name = args.config
    if name in TINY_CONFIG_NAMES:
        return tiny_config(name)
    if name == "flash_slice":
        return flash_slice_config(
            num_layers=args.layers,
            n_routed_experts=args.experts,
            dspark_n_routed_experts=args.dspark_experts,
            engram_vocab_size=args.engram_vocab,
        )
    if name == "flash":
        return ModelConfig.from_hf_dict(flash_config_dict())
    return load_model_config(name)


def run(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    if args.config_only:
        tokenizer = tokenizer_for(config)
        write_config_files(config, args.out, tokenizer)
        print(f"wrote config.json{' and the tokenizer' if tokenizer is not None else ''} to {args.out} "
              "(no weights: load it with --load-format dummy)")
        return 0
    stats = write_checkpoint(
        config,
        args.out,
        seed=args.seed,
        tokenizer=tokenizer_for(config),
        shard_bytes=int(args.shard_size_gb * 1e9),
        single_file=args.single_file,
        progress=not args.quiet,
    )
    print(
        f"wrote {stats.tensors} tensors, {stats.bytes / 1e9:.3f} GB in {stats.files} file(s) to {args.out} "
        f"in {stats.seconds:.1f} s"
    )
    return 0
