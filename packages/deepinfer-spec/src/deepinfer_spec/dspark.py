"""DSpark proposer: drafts from the checkpoint's own draft blocks (model spec §10.2, official §7).

For a sequence whose newest token g sits at position a, the draft blocks run once on
[g, noise, ...] at positions a .. a+B-1 against the target features the main model keyed into their
window rings (positions before a). Slot j gives base logits for position a+j+1; the first-order
Markov head adds a correction from the previous token (g for j = 0, then the draft just drawn), so
drafts are drawn one after another: d_{j+1} ~ (base_j + markov(prev_j)) with the request's own
temperature / top-k / top-p / min-p on the draft RNG stream. The draft distributions stay on the
device for the acceptance test; the confidence head (raw collapsed state, as the release) gives
sigmoid acceptance estimates per draft. A batch of greedy requests drafts the argmax of the adjusted
logits (what a one-hot draw gives) and hands no distributions over: greedy verification compares
tokens only, so the float64 vocabulary distributions and draws per draft are skipped.
"""

from __future__ import annotations

import torch

from deepinfer.models.interface import CausalLM
from deepinfer.ops import get_ops
from deepinfer.sampling.sampler import SampleRow
from deepinfer.speculators.interface import Proposal, ProposeBatch, SpeculatorConfig
from deepinfer.speculators.registry import SpeculatorError
from deepinfer.speculators.verify import row_metadata, sample_drafts


class DSparkProposer:
    def __init__(self, model: CausalLM, num_draft_tokens: int) -> None:
        self.model = model
        self.dspark = model.dspark  # type: ignore[attr-defined]
        self.num_draft_tokens = num_draft_tokens

    @classmethod
    def build(cls, model: CausalLM, config: SpeculatorConfig) -> DSparkProposer:
        dspark = getattr(model, "dspark", None)
        if dspark is None:
            raise SpeculatorError(
                "speculator 'dspark' needs a checkpoint with DSpark draft blocks "
                "(num_nextn_predict_layers > 0 and mtp.* tensors); this model has none: "
                "use speculator 'ngram' or 'none'")
        k = config.num_draft_tokens or dspark.block_size
        if k > dspark.block_size:
            raise SpeculatorError(
                f"num_draft_tokens={k}: the DSpark draft block proposes at most {dspark.block_size} "
                "tokens per step (dspark_block_size)")
        return cls(model, k)

    def propose(self, batch: ProposeBatch) -> Proposal:
        reqs = batch.requests
        ds = self.dspark
        out = ds.draft(self.model.cache, [r.slot for r in reqs], [r.position for r in reqs],  # type: ignore[attr-defined]
                       [r.token_ids[-1] for r in reqs])
        k = max(r.num_drafts for r in reqs)
        prev = batch.sampled.to(out.base_logits.device)
        eos, ops = self.model.eos_token_id, ds.ops or get_ops(device=prev.device)
        greedy = None
        if all(r.params.greedy for r in reqs):  # min_tokens counts as reached, as below
            rows = [SampleRow(r.params, r.seed, r.position + 1, r.params.min_tokens) for r in reqs]
            greedy, _ = row_metadata(rows, out.base_logits.shape[-1], eos, prev.device)
        tokens, probs, embeddings = [], [], []
        for j in range(k):
            markov, embedding = ds.markov(prev)
            logits = out.base_logits[:, j] + markov
            if greedy is not None:
                prev = ops.apply_penalties(logits.float(), greedy).argmax(-1)
            else:
                # min_tokens counts as reached: the target's own ban rejects an early EOS draft anyway
                rows = [SampleRow(r.params, r.seed, r.position + 1 + j, r.params.min_tokens) for r in reqs]
                prev, p = sample_drafts(logits, rows, eos, ops)
                probs.append(p)
            tokens.append(prev)
            embeddings.append(embedding)
        head = type(out)(out.hidden[:, :k], out.normed[:, :k], out.base_logits[:, :k])
        confidences = torch.sigmoid(ds.confidence(head, torch.stack(embeddings, dim=1), "raw"))
        return Proposal(torch.stack(tokens, dim=1), [r.num_drafts for r in reqs],
                        torch.stack(probs, dim=1) if probs else None, confidences.float())

    def release(self, seq_id: int) -> None:
        """Drafting keeps no per-sequence state besides the model's caches."""
