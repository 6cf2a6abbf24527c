"""What verifying a token tree costs against a 1-row step (issue 17's premise, measured).

    .venv/bin/python docs/bench/tree_verify_cost.py [--dtype bf16] [--rows 3,5,9,17,33] [--capacity 512]

The embedded target at 1 thread, 300 tokens in the cache: the compiled 1-row step (plain
decoding), then per row count the target's tree step compiled as the engine builds it
(``CompiledTreeSteps``: weights frozen, ATen matrix products, matmul attention), the same graph
with the C++ GEMM template of the 1-row steps, and the eager tree forward (SDPA). Medians of 30
calls after a warm-up; the first call of each graph is its build.
"""

from __future__ import annotations

import argparse

import torch

from quickdraft.assets import default_target_path
from quickdraft.model.compiled import CPU_INDUCTOR_OPTIONS, TREE_INDUCTOR_OPTIONS, CompiledSteps, CompiledTreeSteps
from quickdraft.model.loader import load_model
from quickdraft.tree import TokenTree, tree_attention_mask, tree_rows

from timing import median_ms

PREFIX = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--rows", default="3,5,9,17,33")
    parser.add_argument("--capacity", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(default_target_path(), dtype=args.dtype).model
    cache = model.new_cache(args.capacity)
    with torch.inference_mode():
        model(torch.randint(0, 4000, (1, PREFIX)), 0, cache)
        one_row = CompiledSteps(model, enabled=True, row_buckets=(1,))
        one_row.prepare(cache)
        print(f"{args.dtype}, {PREFIX} tokens in a {args.capacity}-slot cache, 1 thread")
        print(f"compiled 1-row step (plain decoding): {median_ms(lambda: one_row.run([5], PREFIX, cache)):.2f} ms")
        print("| rows | tree step, compiled (engine) | compiled, C++ GEMM template | eager |")
        print("|---|---|---|---|")
        for rows in (int(r) for r in args.rows.split(",")):
            tree = TokenTree.chain(list(range(10, 10 + rows - 1)))
            tokens, positions, slots = tree_rows(7, PREFIX, tree, rows)
            mask = tree_attention_mask(tree, PREFIX + 1, PREFIX + rows)
            cells = []
            for options in (TREE_INDUCTOR_OPTIONS, CPU_INDUCTOR_OPTIONS[0]):
                steps = CompiledTreeSteps(model, rows, options=options)
                steps.run(tokens, positions, slots, mask, cache)  # build
                cells.append(median_ms(lambda s=steps: s.run(tokens, positions, slots, mask, cache)))
            eager = median_ms(lambda: model.forward_tree(torch.tensor([tokens]), torch.tensor(positions),
                                                         torch.tensor(slots), mask, cache))
            print(f"| {rows} | {cells[0]:.2f} ms | {cells[1]:.2f} ms | {eager:.2f} ms |")


if __name__ == "__main__":
    main()
