"""Train the default model end to end: target (bf16 autocast, fp32 master weights, AdamW), release
export (FP8/FP4 post-training quantisation), DSpark drafter on the frozen release target, evaluation.

    python -m tools.train.train --out OUT [--tokenizer tokenizer.json] [--steps N | --time-budget S]
                                [--draft-steps N | --draft-time-budget S] [--device cuda] [--seed 0]

OUT receives: checkpoint/ (release format, with tokenizer), manifest.json (corpus files + digest),
log.jsonl (one record per logged step), metrics.json (the numbers docs/training.md reports),
loss.png (train/held-out curves), and state.pt (resumable training state; `--resume OUT/state.pt`).
Given a seed and step counts the run is deterministic up to GPU kernel nondeterminism; a time budget
fixes the step count after calibration and logs it, so `--steps` reproduces the run.
`--stop-after-steps`/`--stop-after-seconds` end a run early with its state saved; `--resume` then
continues it exactly (weights, optimizer, data sampler and anchor RNGs, LR schedule position).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from deepinfer.tokenizer import compressed_vocab
from tools.train import dspark
from tools.train.checkpoint import read_release, write_release
from tools.train.config import default_model_config
from tools.train.corpus import build_manifest
from tools.train.data import eval_windows, random_windows, token_stream
from tools.train.evaluate import acceptance, held_out_loss
from tools.train.model import DeepseekV41Train
from tools.train.plot import plot_curves
from tools.train.tokenizer import train_corpus_tokenizer

log = logging.getLogger("train")
CALIBRATION_STEPS = 20
AUX_WEIGHT = 0.1


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _optimizer(params: list[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


STAGES = ("target", "draft")


@dataclass
class RunLimit:
    """How far this process trains before it saves the state and stops (the rest is for --resume)."""

    steps: int | None = None
    deadline: float | None = None  # time.perf_counter() value

    def reached(self) -> bool:
        return (self.steps is not None and self.steps <= 0) or (
            self.deadline is not None and time.perf_counter() >= self.deadline
        )


class Logger:
    def __init__(self, path: Path, resume: dict | None = None):
        """A fresh run starts a new log; a resumed one keeps the records up to the resumed step."""
        self.records: list[dict] = []
        if resume and path.exists():
            at = (STAGES.index(resume["stage"]), resume["step"])
            lines = path.read_text().splitlines()
            recs = [json.loads(line) for line in lines if line]
            self.records = [r for r in recs if (STAGES.index(r["stage"]), r["step"]) <= at]
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        self.f = path.open("a")

    def __call__(self, **rec) -> None:
        self.records.append(rec)
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        log.info(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))


def train_loop(
    stage: str,
    model: DeepseekV41Train,
    params: list[torch.nn.Parameter],
    loss_fn,
    args,
    steps: int | None,
    budget: float | None,
    peak_lr: float,
    logger: Logger,
    state_path: Path,
    resume: dict | None,
    rngs: dict[str, torch.Generator],
    limit: RunLimit,
    metrics: dict,
    eval_fn=None,
) -> bool:
    """Generic loop: seeded batches (`rngs["batches"]`), AdamW, warmup + cosine. Saves the state when
    it ends; returns whether the stage is complete (its step count and throughput then go into
    `metrics`) rather than stopped by `limit`."""
    opt = _optimizer(params, peak_lr)
    gen = rngs["batches"]
    start, seconds = 0, 0.0
    if resume and resume["stage"] == stage:
        seconds = metrics[f"{stage}_seconds"]
        opt.load_state_dict(resume["optimizer"])
        for name, rng in rngs.items():
            rng.set_state(resume["rngs"][name])
        start, steps = resume["step"], resume["total"]
    total = steps or 10**9  # open-ended until the time budget is calibrated
    tokens_per_step = args.batch * args.seq
    t0, step = time.perf_counter(), start
    while step < total and not limit.reached():
        if step == start + CALIBRATION_STEPS and steps is None:
            rate = (time.perf_counter() - t0) / CALIBRATION_STEPS
            total = steps = start + max(CALIBRATION_STEPS + 1, int(budget / rate))
            log.info(
                "%s: %.3f s/step -> %d steps in the budget (reproduce with the step count)",
                stage,
                rate,
                total,
            )
        for group in opt.param_groups:  # before calibration total is open-ended: still warming up
            group["lr"] = lr_at(step, total, peak_lr, args.warmup)
        batch = random_windows(args.stream, args.batch, args.seq + 1, gen)
        with torch.autocast(args.device.type, dtype=torch.bfloat16, enabled=args.device.type == "cuda"):
            loss, parts = loss_fn(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if stage == "target":
            model.update_router_bias(1e-3)
        step += 1
        if limit.steps is not None:
            limit.steps -= 1
        if step % args.log_every == 0 or step == total:
            elapsed = time.perf_counter() - t0
            rec = {
                "stage": stage,
                "step": step,
                "lr": opt.param_groups[0]["lr"],
                "tok_per_s": (step - start) * tokens_per_step / elapsed,
                "elapsed_s": elapsed,
            }
            rec.update({k: float(v) for k, v in parts.items()})
            if eval_fn is not None and (step % (args.log_every * 5) == 0 or step == total):
                rec["held_out"] = eval_fn()
            logger(**rec)
    metrics[f"{stage}_seconds"] = seconds + time.perf_counter() - t0
    done = step >= total
    if done:
        metrics[f"{stage}_steps"] = step
        metrics[f"{stage}_tok_per_s"] = logger.records[-1]["tok_per_s"]
    torch.save(
        {
            "stage": stage,
            "step": step,
            "total": steps,  # None: stopped before the time budget was calibrated
            "optimizer": opt.state_dict(),
            "rngs": {name: rng.get_state() for name, rng in rngs.items()},
            "model": model.state_dict(),
            "metrics": metrics,
        },
        state_path,
    )
    if not done:
        log.info("stopped at %s step %d; state in %s", stage, step, state_path)
    return done


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, help="existing tokenizer.json (default: train one)")
    ap.add_argument("--corpus-root", type=Path, help="stdlib tree to train on (default: this interpreter's)")
    ap.add_argument("--init", type=Path, help="start from the weights of a release checkpoint")
    ap.add_argument("--steps", type=int)
    ap.add_argument(
        "--time-budget", type=float, default=300.0, help="seconds of target training (no --steps)"
    )
    ap.add_argument("--draft-steps", type=int)
    ap.add_argument("--draft-time-budget", type=float, default=90.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--anchors", type=int, default=16, help="draft anchors per sequence")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--device", type=torch.device, default=torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    ap.add_argument(
        "--resume",
        type=Path,
        help="continue from a state file written by --state (same --out and options); the result is "
        "bitwise the one of an uninterrupted run on CPU",
    )
    ap.add_argument(
        "--state",
        type=Path,
        help="where to save the resumable state (weights, optimizer, RNGs, step, metrics so far) when a "
        "stage ends or the run stops early (default: OUT/state.pt)",
    )
    ap.add_argument(
        "--stop-after-steps", type=int, help="end this run after N optimizer steps (both stages count)"
    )
    ap.add_argument("--stop-after-seconds", type=float, help="end this run after S seconds of training steps")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.manual_seed(args.seed)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    state_path = args.state or out / "state.pt"

    manifest = build_manifest(args.corpus_root)
    manifest.write(out / "manifest.json")
    if args.tokenizer:
        tokenizer = Tokenizer.from_file(str(args.tokenizer))
    else:
        tokenizer = train_corpus_tokenizer(manifest, out / "tokenizer").tokenizer
    config = default_model_config(tokenizer)
    t0 = time.perf_counter()
    args.stream = token_stream(manifest, tokenizer, "train").to(args.device)
    held = eval_windows(token_stream(manifest, tokenizer, "eval"), args.seq + 1, args.eval_windows).to(
        args.device
    )
    log.info(
        "tokenised: train %d tokens, held-out %d windows, %.1f s",
        args.stream.numel(),
        held.shape[0],
        time.perf_counter() - t0,
    )
    model = DeepseekV41Train(config, compressed_vocab(tokenizer).token_map, seed=args.seed).to(args.device)
    if args.init:
        model.load_tensors({k: v.to(args.device) for k, v in read_release(args.init)[1].items()})
    # on CPU: generator states must stay there; load_state_dict moves the rest to the parameters' device
    resume = torch.load(args.resume, map_location="cpu") if args.resume else None
    if resume:
        model.load_state_dict(resume["model"])
    limit = RunLimit(
        args.stop_after_steps,
        None if args.stop_after_seconds is None else time.perf_counter() + args.stop_after_seconds,
    )
    logger = Logger(out / "log.jsonl", resume)
    metrics: dict = resume["metrics"] if resume else {}
    metrics |= {
        "config": "tools/train/config.py",
        "corpus_digest": manifest.digest,
        "python": manifest.python_version,
        "train_tokens": args.stream.numel(),
        "params": sum(p.numel() for p in model.parameters()),
    }

    def target_loss(batch: torch.Tensor):
        hidden, _, aux = model(batch[:, :-1])
        ce = F.cross_entropy(model.logits(hidden).flatten(0, 1), batch[:, 1:].flatten())
        aux_loss = torch.stack(aux).mean()
        return ce + AUX_WEIGHT * aux_loss, {"loss": ce.detach(), "indexer_kl": aux_loss.detach()}

    target_params = [model.p(n) for n in model.names if not n.startswith("mtp.")]

    def evaluate() -> float:  # the held-out curve: 64 windows, bf16
        return held_out_loss(model, held[:64], bf16=True)

    if not resume or resume["stage"] == "target":
        model.train()
        done = train_loop(
            "target",
            model,
            target_params,
            target_loss,
            args,
            args.steps,
            args.time_budget,
            args.lr,
            logger,
            state_path,
            resume,
            {"batches": torch.Generator().manual_seed(args.seed)},
            limit,
            metrics,
            evaluate,
        )
        if not done:
            return
        resume = None
    model.eval()
    if not resume:  # a resumed drafter state already holds the release-format target
        metrics["held_out_bf16"] = held_out_loss(model, held, bf16=True)
        metrics["held_out_fp32"] = held_out_loss(model, held, bf16=False)
        write_release(config, model.named_tensors(), tokenizer, ckpt)
        _, release = read_release(ckpt)
        model.load_tensors(release)  # the drafter trains on the target exactly as it ships
        metrics["held_out_release_fp32"] = held_out_loss(model, held, bf16=False)
        metrics["held_out_release_bf16"] = held_out_loss(model, held, bf16=True)
        log.info("held-out: %s", {k: v for k, v in metrics.items() if k.startswith("held_out")})

    draft_params = dspark.drafter_parameters(model)
    bsz = config.text.dspark_block_size
    anchor_gen = torch.Generator().manual_seed(args.seed + 2)

    def draft_loss(batch: torch.Tensor):
        ids = batch[:, :-1]
        with torch.no_grad():
            _, feats, _ = model(ids)
        anchors = torch.randint(1, ids.shape[1] - bsz, (ids.shape[0], args.anchors), generator=anchor_gen)
        anchors = anchors.to(ids.device)
        ce, bce, hit = dspark.draft_losses(model, ids, feats, anchors)
        parts = {"draft_ce": ce.detach(), "conf_bce": bce.detach()}
        parts.update({f"hit{j}": h for j, h in enumerate(hit.tolist())})
        return ce + bce, parts

    done = train_loop(
        "draft",
        model,
        draft_params,
        draft_loss,
        args,
        args.draft_steps,
        args.draft_time_budget,
        args.draft_lr,
        logger,
        state_path,
        resume,
        {"batches": torch.Generator().manual_seed(args.seed + 1), "anchors": anchor_gen},
        limit,
        metrics,
    )
    if not done:
        return
    model.eval()
    write_release(config, model.named_tensors(), tokenizer, ckpt)
    _, release = read_release(ckpt)
    model.load_tensors(release)
    metrics["acceptance"] = acceptance(model, held[:64, :129], new_tokens=64)
    metrics["checkpoint_bytes"] = sum(f.stat().st_size for f in ckpt.iterdir())
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    recs = [r for r in logger.records if r["stage"] == "target"]
    plot_curves(
        [
            [(r["step"], r["loss"]) for r in recs],
            [(r["step"], r["held_out"]) for r in recs if "held_out" in r],
        ],
        out / "loss.png",
    )
    log.info("metrics: %s", json.dumps(metrics))


if __name__ == "__main__":
    main()
