"""An answer whose speech stopped at its frame cap before the model ended it says so: a whole file in its
``X-Audio8-Frame-Cap`` header, an SSE stream in its ``speech.audio.done`` event, every one in the server's log and
``audio8_capped_pieces_total`` (it said nothing: a client heard the audio stop mid-word and could not tell why)."""

from __future__ import annotations

import json
import logging

import pytest

from tests.server.http_support import SETTINGS, metric, serving, speech

NOTE = (
    "speech stopped at the frame cap (5 frames) before the model ended it: the audio may be cut "
    "(a higher max_frames, up to the server's, or a shorter text)"
)


@pytest.fixture(scope="module")
def capped(never_eos_long_checkpoint, tmp_path_factory):
    """A server on the checkpoint that never draws eos: every request speaks to its frame cap."""
    with serving(never_eos_long_checkpoint, tmp_path_factory.mktemp("voices"), SETTINGS) as url:
        yield url


def test_a_whole_answer_cut_at_its_cap_says_so_in_a_header_the_log_and_the_metrics(capped, caplog):
    before = metric(capped, "audio8_capped_pieces_total")
    with caplog.at_level(logging.WARNING, logger="audio8_coreai"):
        r = speech(capped, max_frames=5, response_format="wav", stream=False)
    assert r.status_code == 200 and r.headers["X-Audio8-Frame-Cap"] == NOTE
    assert metric(capped, "audio8_capped_pieces_total") == before + 1
    assert [rec.getMessage() for rec in caplog.records if "frame cap" in rec.getMessage()] == [f"an answer's {NOTE}"]


def test_an_sse_answer_cut_at_its_cap_says_so_in_its_done_event(capped):
    r = speech(capped, max_frames=5, stream_format="sse", response_format="pcm")
    events = [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and [e["type"] for e in events][-1] == "speech.audio.done"
    assert events[-1]["audio8_frame_cap"] == NOTE and events[-1]["usage"]["output_tokens"] == 5
    assert all("audio8_frame_cap" not in e for e in events[:-1])
