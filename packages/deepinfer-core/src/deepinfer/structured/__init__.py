"""Structured output: constraints (JSON Schema, regex, grammars, choices, DSML tool calls) turned into
per-token bitmasks that the sampler applies. `manager.StructuredManager` is the engine's entry point;
`backend` is the seam to the grammar library (llguidance by default)."""
