"""Benchmark harness: plain vs speculative vs peers on the same weights, one process, one report.

``quickdraft.bench.harness`` holds the benchmark (``BenchSettings``, ``run_bench``); this package
imports nothing heavy itself, so that ``quickdraft.bench.load`` stays light.
"""
