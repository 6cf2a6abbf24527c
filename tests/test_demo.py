"""`make demo`: the first thing a newcomer runs says what it measured, and its texts are plain decoding's."""

from __future__ import annotations

import pytest

from quickdraft import demo
from quickdraft.assets import embedded_pair_available


@pytest.mark.skipif(not embedded_pair_available(), reason="the embedded pair is not installed")
def test_the_demo_streams_both_texts_and_reports_them_identical_to_plain_decoding(monkeypatch, capsys):
    monkeypatch.setattr(demo, "MAX_NEW_TOKENS", 40)
    monkeypatch.setattr(demo, "ROUNDS", 1)
    monkeypatch.setenv("QUICKDRAFT_THREADS", "1")
    assert demo.run_demo() == 0
    out = capsys.readouterr().out
    assert out.startswith("--- greedy ---\n" + demo.DEMO_PROMPT)
    greedy, sampled, footer = out.strip().splitlines()[-3:]
    assert greedy.startswith("greedy : 40 tokens at ") and greedy.endswith("output identical to plain greedy decoding")
    assert sampled.startswith("sampled: 40 tokens at ")
    assert sampled.endswith("output identical to plain sampling with the same seed")
    assert "exact mode, 1 thread," in footer and "medians of 2 speculative and 1 plain runs" in footer
