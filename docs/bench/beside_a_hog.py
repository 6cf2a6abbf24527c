"""`quickdraft generate` on an idle machine and beside one CPU-bound process (issue 16's bar).

    .venv/bin/python docs/bench/beside_a_hog.py [--pairs 4] [--max-new-tokens 400] [-- extra generate flags]

Runs ``quickdraft generate --prompt "def parse(line):" --json`` (the embedded pair, default
threads unless flags say otherwise) alternately on the idle machine and beside ``python3 -c "while
True: pass"``, started a second before and killed after. Prints each run's ``stats.tokens_per_s``
(decoding and prefill, start-up not counted), the medians, and the share of the idle speed kept.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

GENERATE = [str(Path(sys.executable).parent / "quickdraft"), "generate", "--prompt", "def parse(line):", "--json"]


def tokens_per_s(max_new_tokens: int, extra: list[str]) -> float:
    out = subprocess.run([*GENERATE, "--max-new-tokens", str(max_new_tokens), *extra], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["stats"]["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=400)
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    idle, busy = [], []
    for _ in range(args.pairs):
        idle.append(tokens_per_s(args.max_new_tokens, extra))
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(1.0)
            busy.append(tokens_per_s(args.max_new_tokens, extra))
        finally:
            hog.kill()
            hog.wait()
        print(f"idle {idle[-1]:.0f}, beside a hog {busy[-1]:.0f} tokens/s", flush=True)
    kept = statistics.median(busy) / statistics.median(idle)
    print(f"medians: idle {statistics.median(idle):.0f} (range {min(idle):.0f}-{max(idle):.0f}), beside a hog "
          f"{statistics.median(busy):.0f} (range {min(busy):.0f}-{max(busy):.0f}) tokens/s: {kept:.0%} kept")


if __name__ == "__main__":
    main()
