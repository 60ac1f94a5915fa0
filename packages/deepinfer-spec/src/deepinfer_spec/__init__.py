"""Speculative decoding plugins for deepinfer, registered under the `deepinfer.speculators` entry points.

- `dspark` (dspark.py): drafts from the checkpoint's DSpark blocks, with draft distributions and
  confidences;
- `ngram` (ngram.py): prompt lookup, deterministic drafts;
- confidence.py / latency.py: confidence-scheduled verification (`--spec-schedule confidence`).

The engine side (interface, exact verification, scheduling) lives in `deepinfer.speculators` and
`deepinfer.engine`.
"""
