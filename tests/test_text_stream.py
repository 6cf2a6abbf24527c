"""Streamed text: the deltas of an incremental decode concatenate to the whole sequence's text, however
the ids arrive, and decoding stays linear in the ids (each step decodes its new ids and a little context)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quickdraft.assets import default_target_path
from quickdraft.model.tokenizer import Tokenizer
from quickdraft.text_stream import TextStream


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(Path(default_target_path()))  # byte-level BPE: a character may span tokens


def streamed(decode, ids: list[int], cuts: list[int], stop: tuple[str, ...] = ()) -> tuple[str, TextStream]:
    """Feed ``ids`` in steps of ``cuts`` sizes (the rest at the end); the deltas joined, and the stream."""
    stream, parts, at = TextStream(decode, stop), [], 0
    for size in [*cuts, len(ids)]:
        if at >= len(ids) or stream.stopped:
            break
        delta, _ = stream.add(ids[at: at + size])
        parts.append(delta)
        at += size
    parts.append(stream.finish())
    return "".join(parts), stream


TEXT = st.text(alphabet=st.sampled_from(list("abc xyz\n(){}=:é€漢字🙂")), max_size=60)
CUTS = st.lists(st.integers(min_value=1, max_value=5), max_size=40)


@settings(max_examples=150, deadline=None)
@given(text=TEXT, cuts=CUTS)
def test_the_deltas_of_an_encoded_text_are_its_decoded_text(text, cuts):
    tok = tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    joined, stream = streamed(tok.decode, ids, cuts)
    assert joined == stream.text == tok.decode(ids)


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=8191), max_size=40), cuts=CUTS)
def test_arbitrary_ids_even_cut_characters_and_invalid_bytes_stream_to_their_text(ids, cuts):
    """Random ids cut multi-byte characters and make invalid UTF-8 (U+FFFD): held back, never retracted."""
    tok = tokenizer()
    joined, stream = streamed(tok.decode, ids, cuts)
    assert joined == stream.text == tok.decode(ids)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=8191), max_size=40), cuts=CUTS)
def test_a_deferred_stream_gives_no_deltas_then_the_whole_text_once(ids, cuts):
    """``generate`` wants the whole text only: the ids are decoded once, at the end, to the text the
    incremental stream gives."""
    tok = tokenizer()
    calls = []
    stream, at = TextStream(lambda part: calls.append(len(part)) or tok.decode(part), deferred=True), 0
    for size in [*cuts, len(ids)]:
        if at >= len(ids):
            break
        assert stream.add(ids[at: at + size]) == ("", len(ids[at: at + size]))
        at += size
    assert not calls
    assert stream.finish() == stream.text == streamed(tok.decode, ids, cuts)[0] == tok.decode(ids)
    assert len(calls) <= 1


def test_stop_strings_cannot_be_deferred():
    with pytest.raises(ValueError, match="cannot be deferred"):
        TextStream(tokenizer().decode, ["\n\n"], deferred=True)


def metaspace_decode(ids: list[int]) -> str:
    """A SentencePiece-style decoder: '▁' is a space, and the text's leading space is dropped."""
    pieces = ["▁the", "▁cat", "s", "▁sat", "▁on", "▁a", "▁mat", ".", "▁é", "t", "é"]
    return "".join(pieces[i] for i in ids).replace("▁", " ").removeprefix(" ")


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=10), max_size=40), cuts=CUTS)
def test_a_decoder_that_drops_the_leading_space_streams_the_spaces_between_steps(ids, cuts):
    joined, stream = streamed(metaspace_decode, ids, cuts)
    assert joined == stream.text == metaspace_decode(ids)


@settings(max_examples=60, deadline=None)
@given(text=TEXT, cuts=CUTS, stop=st.sampled_from(["=", "é€", "🙂", "x\n"]))
def test_a_stop_string_ends_the_text_just_before_it(text, cuts, stop):
    tok = tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    joined, stream = streamed(tok.decode, ids, cuts, (stop,))
    whole = tok.decode(ids)
    assert joined == (whole[: whole.index(stop)] if stream.stopped else whole)
    assert stream.stopped == (stop in whole)


def test_streaming_a_long_answer_token_by_token_decodes_each_id_a_few_times_not_the_whole_prefix_each_step():
    tok = tokenizer()
    ids = tok.encode("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 40,
                     add_special_tokens=False)
    decoded = []

    def counting(part: list[int]) -> str:
        decoded.append(len(part))
        return tok.decode(part)

    joined, _ = streamed(counting, ids, [1] * len(ids))
    assert joined == tok.decode(ids) and len(ids) > 800
    assert sum(decoded) <= 4 * len(ids)  # the whole prefix each step: ~len(ids)² / 2


def rewriting_decode(ids: list[int]) -> str:
    """A decoder whose later tokens rewrite earlier text: token 2 capitalises the character before it."""
    out: list[str] = []
    for i in ids:
        if i == 2:
            if out:
                out[-1] = out[-1].upper()
        else:
            out.append("ab"[i])
    return "".join(out)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=2), max_size=30), cuts=CUTS)
def test_a_decoder_that_rewrites_earlier_text_still_gives_the_whole_text_at_the_end(ids, cuts):
    """Where a step's window no longer starts with its context's text, the stream decodes the whole
    sequence: text already emitted stays emitted (deltas are never retracted), and the result's text
    is the decoder's text of every id."""
    _, stream = streamed(rewriting_decode, ids, cuts)
    assert stream.text == rewriting_decode(ids)


def test_the_whole_sequence_is_decoded_where_a_window_rewrites_its_context():
    calls: list[list[int]] = []

    def recording(part: list[int]) -> str:
        calls.append(list(part))
        return rewriting_decode(part)

    ids = [0, 1, 0, 2]  # "aba", then the last 'a' capitalised: "abA"
    _, stream = streamed(recording, ids, [1, 1, 1, 1])
    assert stream.text == "abA"
    assert ids in calls  # the fallback's whole decode
