import sys, time, torch, statistics
torch.ops.load_library(sys.argv[1])
from quickdraft import kernels
torch.set_num_threads(1)
def t(f, reps=3000):
    for _ in range(50): f()
    xs=[]
    for _ in range(7):
        s=time.perf_counter()
        for _ in range(reps): f()
        xs.append((time.perf_counter()-s)/reps)
    return statistics.median(xs)*1e6
out=[]
for name,(n,k) in {"up":(2048,384),"down":(384,1024),"head2k":(2048,384),"big":(8192,384)}.items():
    w = torch.randn(n,k).bfloat16()*0.05
    for pk,f in [("int8",kernels.pack_int8),("int4",kernels.pack_int4)]:
        p=f(w)
        for m in (1,2,6):
            x=torch.randn(m,k).bfloat16()
            out.append(f"{name}/{pk}/m{m}={t(lambda: torch.ops.quickdraft.linear_bf16(x,p,None,n)):.2f}")
print(" ".join(out))
