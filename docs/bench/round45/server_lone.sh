#!/bin/bash
# $1: max-batch; $2: seconds of client load; prints tokens/s; py-spy records the engine process
MB=$1; SECS=$2; PORT=$((18000 + RANDOM % 1000))
cd "$(git rev-parse --show-toplevel)"
.venv/bin/python -m quickdraft.cli serve --host 127.0.0.1 --port $PORT --max-batch $MB --threads 1 --log-level warning > /tmp/serve_$MB.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -s localhost:$PORT/health >/dev/null && break; sleep 0.5; done
.venv/bin/python - <<PY
import httpx, time, json
from quickdraft.bench.load import TEXT_PROMPTS
url = "http://127.0.0.1:$PORT/v1/completions"
c = httpx.Client(timeout=60)
for p in TEXT_PROMPTS[:4]:
    c.post(url, json={"model": "quickdraft", "prompt": p, "max_tokens": 32, "temperature": 0})
n = 0; t = 0.0; end = time.time() + $SECS; i = 0
while time.time() < end:
    p = TEXT_PROMPTS[i % len(TEXT_PROMPTS)]; i += 1
    s = time.perf_counter()
    r = c.post(url, json={"model": "quickdraft", "prompt": p, "max_tokens": 32, "temperature": 0}).json()
    t += time.perf_counter() - s; n += r["usage"]["completion_tokens"]
print(f"max-batch $MB: {n/t:.0f} tokens/s over {i} requests")
PY
kill $SP; wait $SP 2>/dev/null
