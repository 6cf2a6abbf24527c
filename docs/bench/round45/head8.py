"""head8.py: the embedded target's 1- and 6-row forwards at 150 cached tokens with its LM head as int8 instead of
bf16 (what an exact int8 screen of a greedy head could save; not an exact path itself)."""
from bench_common import step_us, target_with_context

from quickdraft import kernels
from quickdraft.model.native import NativeForward

model, cache, tokens = target_with_context(400)
bf16_head = model.native
int8_head = NativeForward(model)
int8_head.weights = [*int8_head.weights[:-1], kernels.pack_int8(model.lm_head.weight)]
for rows in (1, 6):
    res = {}
    for name, forward in (("bf16 head", bf16_head), ("int8 head", int8_head), ("bf16 head ", bf16_head),
                          ("int8 head ", int8_head)):
        model.native = forward
        res[name] = step_us(model, cache, tokens, 150, rows, reps=200, rounds=7)
    model.native = bf16_head
    print(rows, {k: round(v) for k, v in res.items()})
