"""Benchmark harness: plain vs speculative vs peers on the same weights, one process, one report."""

from quickdraft.bench.harness import BenchSettings, load_prompts, run_bench

__all__ = ["BenchSettings", "load_prompts", "run_bench"]
