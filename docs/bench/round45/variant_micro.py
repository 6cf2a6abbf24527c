"""variant_micro.py SO: 1-8-row forwards of the embedded target at 150 cached tokens, the kernels from SO."""
import sys
from pathlib import Path

from bench_common import step_us, target_with_context, use_kernels

use_kernels(sys.argv[1])
model, cache, tokens = target_with_context(400)
rows = (1, 2, 4, 6, 8)
out = [step_us(model, cache, tokens, 150, r) for r in rows]
print(Path(sys.argv[1]).stem, " ".join(f"{r}:{v:.0f}" for r, v in zip(rows, out)), f"6/1 {out[3] / out[0]:.3f}")
