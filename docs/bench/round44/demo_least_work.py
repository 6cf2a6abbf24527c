"""Round 44. `quickdraft demo` in this process with the kernels' least work per thread set first (0: every product and
attention shared between the threads, as before round 44), so that processes with either value can alternate.

    .venv/bin/python docs/bench/round44/demo_least_work.py WORK
"""
import sys
from quickdraft import kernels
from quickdraft.cli import main

kernels.set_min_task_work(int(sys.argv[1]))
sys.exit(main(["demo"]))
