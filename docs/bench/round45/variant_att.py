"""variant_att.py SO: 1- and 6-row forwards at 300 and 600 cached tokens (the attention's share grows), the kernels from SO."""
import sys
from pathlib import Path

from bench_common import step_us, target_with_context, use_kernels

use_kernels(sys.argv[1])
model, cache, tokens = target_with_context(700)
out = [(L, r, step_us(model, cache, tokens, L, r)) for L in (300, 600) for r in (1, 6)]
print(Path(sys.argv[1]).stem, " ".join(f"L{L}r{r}:{v:.0f}" for L, r, v in out))
