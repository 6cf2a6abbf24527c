import pickle, sys
for src in ("heldout", "bench"):
    calls = [c for c in pickle.load(open(f"/tmp/conf_{src}.pkl", "rb")) if c[1] is not None]
    def run(rule):
        toks = 0; t = 0.0
        for p, n_acc in calls:
            n = rule(p)
            toks += min(n_acc, n) + 1
            t += 570 + 90 * n + 0 * 0
        return toks / t * 1e3
    plain = 1 / (600 + 98) * 1e3  # tokens per ms of plain: step 600 us + python 98
    print(src, len(calls), "calls")
    for g in (3, 4, 5, 6):
        print(f"  fixed gamma {g}: speedup {run(lambda p, g=g: g)/plain:.3f}")
    for tau in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        def rule(p, tau=tau):
            cum = 1.0
            for i, x in enumerate(p):
                cum *= x
                if cum < tau and i >= 0:
                    return i + 1  # this token drafted, stop after it
            return len(p)
        def rule_keep(p, tau=tau):  # stop before a token whose cumulative falls below tau (drop it)
            cum = 1.0
            for i, x in enumerate(p):
                cum *= x
                if cum < tau:
                    return max(i, 1)
            return len(p)
        print(f"  cum-stop tau {tau}: include {run(rule)/plain:.3f}  drop {run(rule_keep)/plain:.3f}")
