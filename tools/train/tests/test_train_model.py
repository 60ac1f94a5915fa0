"""The training model computes the runtime's function; export/import round-trips; training is seeded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from deepinfer.checkpoint.loader import load_checkpoint
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, load_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing import write_tiny_checkpoint
from deepinfer.tokenizer import compressed_vocab
from tools.train import dspark
from tools.train.checkpoint import read_release, write_release
from tools.train.model import DeepseekV41Train
from tools.train.plot import plot_curves


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint("full", tmp_path_factory.mktemp("full"), seed=3)


def _model(path: Path) -> DeepseekV41Train:
    config, tensors = read_release(path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    model = DeepseekV41Train(config, compressed_vocab(tok).token_map)
    model.load_tensors(tensors)
    return model.eval()


def _runtime(path: Path) -> DeepseekV41Runtime:
    return load_runtime(path, options=RuntimeOptions(cache_precision="exact"))


def _prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return [0, *torch.randint(3, vocab, (n - 1,), generator=torch.Generator().manual_seed(seed)).tolist()]


def test_logits_match_the_runtime(tiny: Path) -> None:
    # 120 tokens: the indexer prunes, candidate blocks prune, Engram and YOCO consumers are live
    model, rt = _model(tiny), _runtime(tiny)
    for n in (5, 120):
        ids = _prompt(n, model.cfg.vocab_size, n)
        with torch.no_grad():
            ours = model.logits(model(torch.tensor([ids]))[0])[0]
        ref = rt.score([ids])[0]
        assert (ours - ref).abs().max().item() < 1e-4


def test_drafts_match_the_runtime(tiny: Path) -> None:
    model, rt = _model(tiny), _runtime(tiny)
    ids, a = _prompt(60, model.cfg.vocab_size), 37
    rt.allocate_cache(3, 3)
    rt.reset_slot(1)
    rt.forward(ForwardBatch([SequenceSegment(1, [1], 0, ids[:a], "none")]))
    ref = rt.dspark.draft(rt.cache, [1], [a], [ids[a]])
    prev = torch.tensor([ids[a : a + model.cfg.dspark_block_size]])
    ref_markov, e = rt.dspark.markov(prev)
    with torch.no_grad():
        feats = model(torch.tensor([ids]))[1]
        d = dspark.draft(
            model, dspark.context_features(model, feats), torch.tensor([[ids[a]]]), torch.tensor([[a]])
        )
        markov, e2 = dspark.markov(model, prev.unsqueeze(0))
        conf = dspark.confidence(model, d.hidden, e2)
    assert (d.base_logits[0, 0] - ref.base_logits[0]).abs().max().item() < 1e-4
    assert (markov[0] - ref_markov).abs().max().item() < 1e-5
    assert (conf[0] - rt.dspark.confidence(ref, e)).abs().max().item() < 1e-4


def test_export_round_trip(tiny: Path, tmp_path: Path) -> None:
    config, tensors = read_release(tiny)
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    write_release(config, tensors, tok, tmp_path, shard_bytes=1 << 20)
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    names = load_checkpoint(tmp_path, progress=False).tensors.keys()
    assert names == load_checkpoint(tiny, progress=False).tensors.keys()
    # released values re-quantise to the same values (power-of-two scales: a scale may move, no value does)
    again = read_release(tmp_path)[1]
    assert all(torch.equal(again[name], t) for name, t in tensors.items())


def _train(config, token_map, batch: torch.Tensor, steps: int) -> tuple[list[float], DeepseekV41Train]:
    model = DeepseekV41Train(config, token_map, seed=1).train()
    params = [p for n, p in zip(model.names, model.parameters()) if not n.startswith("mtp.")]
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    for _ in range(steps):
        hidden, _, aux = model(batch[:, :-1])
        loss = F.cross_entropy(model.logits(hidden).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        (loss + 0.1 * torch.stack(aux).mean()).backward()
        opt.step()
        model.update_router_bias(1e-3)
        losses.append(loss.item())
    return losses, model


def test_training_steps_learn_and_are_seeded(tiny: Path) -> None:
    config, _ = read_release(tiny)
    token_map = compressed_vocab(Tokenizer.from_file(str(tiny / "tokenizer.json"))).token_map
    batch = torch.stack([torch.tensor(_prompt(41, config.text.vocab_size, s)) for s in range(2)])
    losses, first = _train(config, token_map, batch, 6)
    assert losses[-1] < losses[0] - 0.5
    _, second = _train(config, token_map, batch, 6)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))


def test_draft_loss_trains_every_drafter_tensor_and_nothing_else(tiny: Path) -> None:
    model = _model(tiny)
    params = dspark.drafter_parameters(model)
    ids = torch.tensor([_prompt(40, model.cfg.vocab_size)])
    with torch.no_grad():
        feats = model(ids)[1]
    ce, bce, hit = dspark.draft_losses(model, ids, feats, torch.tensor([[3, 20, 30]]))
    (ce + bce).backward()
    with_grad = {n for n in model.names if model.p(n).grad is not None}
    # router biases only steer the selection (balanced by a rule, not by gradients)
    trained = {
        n for n in model.names if n.startswith("mtp.") and not n.endswith(("gate.bias", "gate.bias_vl"))
    }
    assert with_grad == trained and len(params) == len(trained) + 2 * model.cfg.num_nextn_predict_layers
    assert hit.shape == (model.cfg.dspark_block_size,)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    plot_curves([[(0, 3.0), (10, 2.0)], [(5, 2.5)]], tmp_path / "loss.png", width=64, height=32)
    data = (tmp_path / "loss.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and int.from_bytes(data[16:20], "big") == 64
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_curves([[]], tmp_path / "empty.png")
