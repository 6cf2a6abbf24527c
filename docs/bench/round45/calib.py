import pickle, collections
calls = [c for c in pickle.load(open("/tmp/conf_heldout.pkl", "rb")) if c[1] is not None]
b = collections.defaultdict(lambda: [0, 0])
for p, n in calls:
    for i, x in enumerate(p):
        if i > n: break  # not reached (a rejection before)
        key = min(int(x * 10), 9)
        b[key][0] += 1; b[key][1] += (i < n)
for k in sorted(b): print(f"p in [{k/10:.1f},{(k+1)/10:.1f}): n={b[k][0]:5d} accept rate {b[k][1]/b[k][0]:.2f}")
