"""What a decode step costs per row count: torch's paths against quickdraft's CPU kernels (rounds 9-10).

    .venv/bin/python docs/bench/kernel_step_cost.py [--rows 1,2,3,5,9,17] [--prefix 300] [--capacity 512]
                                                    [--dtype bf16|fp32] [--threads 1]

The embedded target at ``--threads`` threads, ``--prefix`` tokens in a ``--capacity``-slot cache:
1. the model's 25 weight products alone (bf16 only): ``F.linear`` (torch's default), oneDNN on
   weights packed once (``torch.ops.mkldnn._linear_pointwise``, what inductor's freezing uses) and
   ``kernels.linear_bf16``;
2. a whole step: the compiled graph of rounds 6-8 (inductor, weight freezing, C++ GEMM template;
   a second copy of the model that is not packed) against the native forward (one C++ call), built
   for the CPU's instruction set (printed).
Medians of 50 calls after a warm-up, interleaved per row count, in one process.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F

from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.model.compiled import CompiledSteps
from quickdraft.model.loader import load_model

from timing import median_ms as timed

median_ms = partial(timed, calls=50, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,5,9,17")
    parser.add_argument("--prefix", type=int, default=300)
    parser.add_argument("--capacity", type=int, default=512)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not kernels.available():
        raise SystemExit("quickdraft's CPU kernels are unavailable here (neither AVX512-BF16 nor AVX2, or no C++ compiler)")
    torch.set_num_threads(args.threads)
    rows_list = [int(r) for r in args.rows.split(",")]
    torch_model = load_model(default_target_path(), dtype=args.dtype).model  # torch's paths: never packed
    native_model = load_model(default_target_path(), dtype=args.dtype).model
    assert native_model.pack_products() and native_model.native is not None
    layers = [m for m in torch_model.modules() if isinstance(m, torch.nn.Linear)]
    weights = [m.weight.detach() for m in layers]
    products = args.dtype == "bf16"
    try:
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights] if products else []
    except RuntimeError:  # oneDNN's bf16 needs AVX-512 (or AVX-NE-CONVERT)
        onednn = []
    ours = [kernels.pack_bf16(w) for w in weights] if products else []
    print(f"embedded target, {args.dtype}, {args.threads} thread(s), kernels built for {kernels.loaded_isa()}, "
          f"{args.prefix} tokens in a {args.capacity}-slot cache; medians, ms")
    print("| rows | products: F.linear | oneDNN packed | quickdraft | step: compiled graph (rounds 6-8) | "
          "native forward |")
    print("|---|---|---|---|---|---|")
    with torch.inference_mode():
        caches = [torch_model.new_cache(args.capacity), native_model.new_cache(args.capacity)]
        prompt = torch.randint(0, 4000, (1, args.prefix), generator=torch.Generator().manual_seed(0))
        torch_model(prompt, 0, caches[0])
        native_model(prompt, 0, caches[1])
        compiled = CompiledSteps(torch_model, enabled=True, row_buckets=tuple(rows_list))
        compiled.prepare(caches[0])
        native = CompiledSteps(native_model, enabled=True, row_buckets=tuple(rows_list))
        for rows in rows_list:
            xs = [torch.randn(rows, w.shape[1]).to(w.dtype) for w in weights]
            cells = [
                median_ms(lambda: [F.linear(x, w) for x, w in zip(xs, weights)]) if products else None,
                median_ms(lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
                                   for x, w in zip(xs, onednn)]) if onednn else None,
                median_ms(lambda: [kernels.linear_bf16(x, p, None, w.shape[0]) for x, p, w in zip(xs, ours, weights)])
                if products else None,
                median_ms(lambda: compiled.run([5] * rows, args.prefix, caches[0])),
                median_ms(lambda: native.run([5] * rows, args.prefix, caches[1])),
            ]
            print(f"| {rows} | " + " | ".join("–" if c is None else f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
