"""Issue 16's text bar for each shipped pair: how often the demo's greedy text (and its seeded sample)
repeats one line, on the demo's prompt and on the bench's prompts.

    python docs/bench/demo_text_repeats.py [--targets embedded embedded-copy] [--prompt-limit 14]

Plain decoding of the target alone (speculation writes the same text: the demo checks that). A line
counts when it has a non-blank character; the figure is the most times one line occurs in the
generated text (the bar: at most twice on the demo's prompt)."""

from __future__ import annotations

import argparse
import collections
import json
import statistics

from quickdraft.bench.harness import load_prompts
from quickdraft.cli import apply_threads
from quickdraft.demo import DEMO_PROMPT, DEMO_SAMPLING, MAX_NEW_TOKENS
from quickdraft.engine import Engine
from quickdraft.sampling import GREEDY


def most_repeated_line(text: str) -> tuple[int, str]:
    counts = collections.Counter(line.strip() for line in text.splitlines() if line.strip())
    if not counts:
        return 0, ""
    line, n = counts.most_common(1)[0]
    return n, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["embedded", "embedded-copy"])
    parser.add_argument("--prompt-limit", type=int, default=14)
    args = parser.parse_args()
    apply_threads()
    prompts = [p["prompt"] for p in load_prompts(limit=args.prompt_limit)]
    report = {}
    for target in args.targets:
        engine = Engine(target, None, exact=False, dtype="auto")
        greedy = engine.generate(DEMO_PROMPT, MAX_NEW_TOKENS, GREEDY, gamma=0).text
        sample = engine.generate(DEMO_PROMPT, MAX_NEW_TOKENS, DEMO_SAMPLING, gamma=0).text
        bench = [most_repeated_line(engine.generate(p, 96, GREEDY, gamma=0).text)[0] for p in prompts]
        report[target] = {
            "demo greedy": most_repeated_line(greedy), "demo sample": most_repeated_line(sample),
            "bench greedy, most repeated line per prompt (median, max)": (statistics.median(bench), max(bench)),
            "bench prompts with a line repeated more than twice": sum(n > 2 for n in bench),
        }
        print(f"=== {target}: demo greedy text ===\n{DEMO_PROMPT}{greedy}\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
