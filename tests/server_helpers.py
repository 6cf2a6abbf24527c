"""What the server tests read from a running server: its Prometheus figures, and waiting for one."""

from __future__ import annotations

import time

import httpx


def metric(server_url: str, name: str, **labels: str) -> float:
    """The value of quickdraft_<name>{labels} on the server's /metrics (0 when absent)."""
    text = httpx.get(server_url + "/metrics").text
    want = "quickdraft_" + name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels
                                   else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def hang_up_after_first_token(server_url: str, body: dict) -> None:
    """Stream a completion and disconnect as soon as its first chunk arrives."""
    with httpx.stream("POST", server_url + "/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                return
