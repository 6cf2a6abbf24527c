"""Round 43. An intermittent load on one core: busy BUSY_MS, then asleep IDLE_MS, for SECONDS.

    python3 docs/bench/round43/intermittent_load.py BUSY_MS IDLE_MS SECONDS
"""
import sys, time
busy_ms, idle_ms = float(sys.argv[1]), float(sys.argv[2])
end = time.time() + float(sys.argv[3])
while time.time() < end:
    t = time.perf_counter()
    while time.perf_counter() - t < busy_ms / 1e3:
        pass
    time.sleep(idle_ms / 1e3)
