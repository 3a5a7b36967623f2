"""One TTS shared by threads (tiny checkpoint): they take turns call by call, a stream step by step; what overtakes
a stream, reads it from two threads or calls the TTS from inside its own utterance is said, never a hang."""

from __future__ import annotations

import numpy as np
import pytest

from audio8_coreai.errors import EngineError
from audio8_coreai.request import check_request


def test_threads_take_turns_and_an_overtaken_stream_says_so(tiny_tts):
    """One TTS, several callers: threads' utterances are each what they are alone; a stream resumed after
    another utterance ran raises instead of continuing from the other's KV state."""
    import threading

    want = {
        seed: tiny_tts.generate(f"Thread number {seed} speaks.", seed=seed, max_frames=16).codes for seed in (5, 6, 7)
    }
    got: dict = {}

    def speak(seed):
        got[seed] = tiny_tts.generate(f"Thread number {seed} speaks.", seed=seed, max_frames=16).codes

    threads = [threading.Thread(target=speak, args=(s,)) for s in want]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(got[s], want[s]) for s in want)

    stream = iter(tiny_tts.stream("Hello there, a paused stream.", seed=9, max_frames=16, chunk_frames=2))
    next(stream)
    tiny_tts.generate("Something else.", seed=1, max_frames=4)
    with pytest.raises(EngineError, match="this stream was overtaken"):
        list(stream)
    fresh = np.concatenate(
        list(tiny_tts.stream("Hello there, a paused stream.", seed=9, max_frames=16, chunk_frames=2))
    )
    assert fresh.size > 0  # the next stream is whole again


def test_synthesize_of_several_pieces_is_not_overtaken_by_another_thread(tiny_tts):
    """synthesize speaks a long text's pieces as a stream: it keeps the model for the whole call (the lease's
    reserve), so another thread's utterances wait for it instead of overtaking it between two of its frames."""
    import threading

    text = "First sentence here. Second one follows. Third is last."
    plan = tiny_tts.plan(check_request(text, seed=3, max_frames=8))
    assert len(plan.pieces) > 1
    alone, _ = tiny_tts.synthesize(plan)
    short = tiny_tts.generate("Other.", seed=1, max_frames=2).codes
    started, done = threading.Event(), threading.Event()
    others: list = []

    def other():
        while not done.is_set():
            others.append(tiny_tts.generate("Other.", seed=1, max_frames=2).codes)
            started.set()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert started.wait(60)
        rounds = [tiny_tts.synthesize(plan)[0] for _ in range(3)]
    finally:
        done.set()
        thread.join()
    assert all(np.array_equal(audio, alone) for audio in rounds)
    assert all(np.array_equal(codes, short) for codes in others)


def test_a_stream_read_by_two_threads_at_once_says_so(tiny_tts):
    """A chunk asked for while another thread's is being made raises EngineError (Python's generator said
    "generator already executing"); the first reader goes on to the stream's whole audio."""
    import threading

    text = "Hello there, one stream."
    want = np.concatenate(list(tiny_tts.stream(text, seed=2, max_frames=8, chunk_frames=2)))
    inside, go_on = threading.Event(), threading.Event()
    stream = tiny_tts.stream(
        text, seed=2, max_frames=8, chunk_frames=2, on_frame=lambda step: (inside.set(), go_on.wait(30))
    )
    chunks: list = []
    reader = threading.Thread(target=lambda: chunks.extend(stream))
    reader.start()
    try:
        assert inside.wait(60)
        with pytest.raises(EngineError, match="being read by another thread"):
            next(iter(stream))
    finally:
        go_on.set()
        reader.join(60)
    assert np.array_equal(np.concatenate(chunks), want)


def calling_inside(call) -> tuple:
    """An ``on_frame`` that makes ``call()`` (a call on the TTS speaking) at step 1, and the list of the EngineErrors
    it got there (each raised on, stopping the outer utterance)."""
    inner: list[BaseException] = []

    def on_frame(step):
        if step == 1:
            try:
                call()
            except EngineError as e:
                inner.append(e)
                raise

    return on_frame, inner


def test_a_call_from_its_own_on_frame_is_refused_not_a_hang(tiny_tts):
    """generate's on_frame runs with the model held: a call on the same TTS there would wait for itself for ever.
    It raises EngineError, the outer utterance stops with it, and the TTS serves the next call whole."""
    want = tiny_tts.generate("Hello there.", seed=0, max_frames=6).codes
    on_frame, inner = calling_inside(lambda: tiny_tts.generate("Inner.", seed=1, max_frames=2))

    import threading

    outer: list[BaseException] = []

    def speak():
        try:
            tiny_tts.generate("Hello there.", seed=0, max_frames=6, on_frame=on_frame)
        except EngineError as e:
            outer.append(e)

    thread = threading.Thread(target=speak, daemon=True)  # a hang fails the test, not the run
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "generate called from its own on_frame hangs"
    assert len(inner) == 1 and "from inside its own utterance" in str(outer[0])
    assert np.array_equal(tiny_tts.generate("Hello there.", seed=0, max_frames=6).codes, want)


def test_a_call_from_a_streams_own_on_frame_is_refused_before_it_runs(tiny_tts):
    """A stream's on_frame runs with the model held, as generate's: a synthesis called there is refused at once (it
    ran whole, then the outer stream said it was overtaken)."""
    on_frame, calls = calling_inside(lambda: tiny_tts.synthesize("Inner words here.", seed=1, max_frames=4))
    stream = tiny_tts.stream("Hello there.", seed=0, max_frames=6, on_frame=on_frame)
    with pytest.raises(EngineError, match="from inside its own utterance"):
        list(stream)
    assert len(calls) == 1 and tiny_tts.generate("Hello there.", seed=0, max_frames=6).seed == 0  # served next
