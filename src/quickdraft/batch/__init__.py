"""Continuous batching (``scheduler``), its drafters, prefill and shapes."""

# Concurrent sequences per step, the server's default too. 32, measured (BENCHMARKS.md, round 13):
# at 32 clients 16 slots queue half of them (TTFT p50 0.19 s, 3,005 tokens/s) where 32 serve all
# (0.05 s, 3,726 tokens/s), for 66 more MiB of bf16 KV cache on the embedded target.
DEFAULT_MAX_BATCH = 32
