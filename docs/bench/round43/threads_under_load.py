"""Round 43. `quickdraft serve` with its default threads (the governor) under CLIENTS streaming clients run from this
machine for SECONDS: scrapes quickdraft_threads every 0.25 s and prints how long each count held, and the tokens/s.

    .venv/bin/python docs/bench/round43/threads_under_load.py [CLIENTS] [SECONDS] [PORT] [SERVE ARGS...]   (e.g. --threads 2)
"""
import collections, subprocess, sys, threading, time
import httpx

clients = int(sys.argv[1]) if len(sys.argv) > 1 else 16
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20
port = int(sys.argv[3]) if len(sys.argv) > 3 else 8765
url = f"http://127.0.0.1:{port}"
server = subprocess.Popen([sys.executable, "-c", "import sys; from quickdraft.cli import main; sys.exit(main())", "serve", "--port", str(port), *sys.argv[4:]],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    prompts = ["def read_config(path):\n", "class Stack:\n    def __init__(self):\n", "import os\n\n\ndef list_files(root):\n"]
    tokens, stop = [0], time.monotonic() + seconds

    def client(i):
        while time.monotonic() < stop:
            r = httpx.post(url + "/v1/completions", json={"model": "quickdraft", "prompt": prompts[i % 3], "max_tokens": 32,
                                                          "temperature": 0}, timeout=60)
            tokens[0] += r.json()["usage"]["completion_tokens"]

    def threads_now():
        for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("quickdraft_threads "):
                return int(float(line.split()[1]))

    workers = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for w in workers:
        w.start()
    held, timeline = collections.Counter(), []
    while time.monotonic() < stop:
        count = threads_now()
        held[count] += 1
        timeline.append(count)
        time.sleep(0.25)
    for w in workers:
        w.join()
    print(f"{clients} clients, {seconds:.0f} s: {tokens[0] / (time.monotonic() - start):.0f} tokens/s; quickdraft_threads "
          f"samples by count {dict(held)}; timeline {''.join(map(str, timeline))}")
finally:
    server.terminate()
    server.wait()
