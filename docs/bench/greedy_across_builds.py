"""Do two builds of the CPU kernels write the same greedy text? (round 16)

    .venv/bin/python docs/bench/greedy_across_builds.py [--builds amx_bf16,avx512_bf16] [--tokens 128]

Each build (``QUICKDRAFT_KERNELS_ISA``) decodes the bench prompts plainly and greedily with the
embedded target (bf16, 1 thread) in a process of its own; prints how many outputs are identical and
where the others first differ. Builds sum in different orders, so a near-tie of the top two logits
can flip; within one build speculative decoding still equals plain decoding bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

DECODE = """
import json, sys, torch
from quickdraft import Engine, kernels
from quickdraft.assets import default_target_path
from quickdraft.bench.harness import load_prompts
torch.set_num_threads(1)
engine = Engine(str(default_target_path()), None, dtype="bf16")
outputs = [engine.generate(p["prompt"], int(sys.argv[1]), gamma=0).token_ids for p in load_prompts(None)]
print(json.dumps({"isa": kernels.loaded_isa(), "outputs": outputs}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", default="amx_bf16,avx512_bf16")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    runs = {}
    for build in args.builds.split(","):
        done = subprocess.run([sys.executable, "-c", DECODE, str(args.tokens)], capture_output=True, text=True,
                              env={**os.environ, "QUICKDRAFT_KERNELS_ISA": build}, check=True)
        runs[build] = json.loads(done.stdout.strip().splitlines()[-1])
        if runs[build]["isa"] != build:
            raise SystemExit(f"{build}: this CPU cannot run it (got {runs[build]['isa']})")
    (a, first), (b, second) = list(runs.items())[:2]
    differ = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), min(len(u), len(v)))
              for u, v in zip(first["outputs"], second["outputs"]) if u != v]
    print(f"{a} vs {b}: {len(first['outputs']) - len(differ)} of {len(first['outputs'])} greedy outputs identical; "
          f"the others first differ at tokens {differ}")


if __name__ == "__main__":
    main()
