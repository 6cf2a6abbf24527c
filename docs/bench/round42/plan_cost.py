"""Round 42. What goodput's planning (``BatchScheduler._draft_lengths``) costs a step under steady load, with
goodput's plain plan kept for up to REPLAN_EVERY steps ("kept") and planned every step as in round 41 ("every
step"): CLIENTS requests always in flight (steady_plan_ab.py's load), auto gamma, blocks of SECONDS alternating.

    .venv/bin/python docs/bench/round42/plan_cost.py [CLIENTS] [SECONDS] [BLOCKS]
"""
import statistics
import sys
import time

sys.argv += [] if len(sys.argv) > 3 else ["16", "3", "4"][len(sys.argv) - 1:]
exec(open(__file__.replace("plan_cost.py", "steady_plan_ab.py")).read().split("ARMS = ")[0])

planning = scheduler._draft_lengths
spent = [0.0, 0]


def timed(ready):
    t0 = time.perf_counter()
    lengths = planning(ready)
    spent[0] += time.perf_counter() - t0
    spent[1] += 1
    return lengths


scheduler._draft_lengths = timed
per_step = {"auto": [], "auto, plans every step": []}
for b in range(blocks):
    for arm in (("auto", "auto, plans every step") if b % 2 == 0 else ("auto, plans every step", "auto")):
        spent[:] = [0.0, 0]
        rate, gammas = block(arm, seconds)
        per_step[arm].append(spent[0] / spent[1] * 1e6)
        print(f"block {b} {arm}: {rate:.0f} tok/s, planning {per_step[arm][-1]:.1f} us a step over {spent[1]} steps, "
              f"steps by gamma {dict(gammas)}", flush=True)
print(f"{clients} clients, planning per step (median): " + ", ".join(
    f"{arm} {statistics.median(v):.1f} us" for arm, v in per_step.items()))
