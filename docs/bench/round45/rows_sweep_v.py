"""rows_sweep_v.py SO: 1-, 6-, 7- and 8-row forwards of the embedded target at 150 cached tokens, the kernels from SO."""
import sys
from pathlib import Path

from bench_common import step_us, target_with_context, use_kernels

use_kernels(sys.argv[1])
model, cache, tokens = target_with_context(400)
out = {r: step_us(model, cache, tokens, 150, r) for r in (1, 6, 7, 8)}
print(Path(sys.argv[1]).stem, " ".join(f"{r}:{v:.0f}" for r, v in out.items()))
