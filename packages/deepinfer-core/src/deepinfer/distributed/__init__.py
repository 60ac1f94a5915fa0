"""Several ranks serving one model: attention data parallelism, expert parallelism for the routed
experts, row-sharded Engram tables, EPLB and the rank launcher (see docs/distributed.md)."""
