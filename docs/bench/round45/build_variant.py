import sys, subprocess
from pathlib import Path
from quickdraft import kernels as k
out = Path(sys.argv[1]); extra = sys.argv[2:]
isa_flags = k.ISAS[k.loaded_isa()][1]
cmd = k._command(k._compiler(), out, tuple(isa_flags) + tuple(extra))
subprocess.run(cmd, check=True)
print("built", out)
