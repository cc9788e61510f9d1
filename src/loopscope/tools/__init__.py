"""tools: what no stage runs (plan, benchmarks, the depth-use search)."""
