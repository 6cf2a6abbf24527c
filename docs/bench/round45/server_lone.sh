#!/bin/bash
# One client sending 32-token greedy completions one after another to `quickdraft serve --threads 1` (the
# embedded pair's default drafter) for SECS seconds; prints the rate and the requests completed.
#   server_lone.sh MAX_BATCH SECS [stream] [spy]
# MAX_BATCH 1: one request at a time; 32: the batch scheduler. "stream": streamed completions (the rate is
# then of non-empty chunks). "spy": py-spy records the server and its engine process for 10 s, 3 s in,
# to /tmp/spy_server_MAX_BATCH.txt (raw format).
MB=$1; SECS=$2; STREAM=$([ "$3" = stream ] && echo True || echo False); PORT=$((18000 + RANDOM % 1000))
cd "$(git rev-parse --show-toplevel)"
.venv/bin/python -m quickdraft.cli serve --host 127.0.0.1 --port $PORT --max-batch $MB --threads 1 --log-level warning > /tmp/serve_$MB.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -s localhost:$PORT/health >/dev/null && break; sleep 0.5; done
if [ "$4" = spy ] || [ "$3" = spy ]; then
  (sleep 3; .venv/bin/py-spy record -r 500 -f raw -s -d 10 -o /tmp/spy_server_$MB.txt --pid $SP --nonblocking > /dev/null 2>&1) &
fi
.venv/bin/python - <<PY
import httpx, time, json
from quickdraft.bench.load import TEXT_PROMPTS
url = "http://127.0.0.1:$PORT/v1/completions"
stream = $STREAM
c = httpx.Client(timeout=60)

def complete(prompt: str) -> int:
    """Tokens (or, streaming, non-empty chunks) of one completion."""
    body = {"model": "quickdraft", "prompt": prompt, "max_tokens": 32, "temperature": 0, "stream": stream}
    if not stream:
        return c.post(url, json=body).json()["usage"]["completion_tokens"]
    with c.stream("POST", url, json=body) as r:
        return sum(len(json.loads(line[6:])["choices"][0]["text"]) > 0
                   for line in r.iter_lines() if line.startswith("data: {"))

for p in TEXT_PROMPTS[:4]:
    complete(p)
n = 0; t = 0.0; end = time.time() + $SECS; i = 0
while time.time() < end:
    s = time.perf_counter(); n += complete(TEXT_PROMPTS[i % len(TEXT_PROMPTS)]); t += time.perf_counter() - s; i += 1
print(f"max-batch $MB: {n/t:.0f} {'chunks' if stream else 'tokens'}/s over {i} requests")
PY
kill $SP; wait $SP 2>/dev/null
