"""The Python API end to end on a project-made tiny checkpoint: determinism, no state leaks, bad input."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from audio8_coreai.errors import ClipWarning, EngineError, PromptError
from audio8_coreai.settings import DEFAULTS

TEXT = "The meeting has been moved to Thursday afternoon."


def test_synthesize_shape_and_rate(tiny_tts):
    audio, rate = tiny_tts.synthesize(TEXT, seed=1, max_frames=40)
    out = tiny_tts.generate(TEXT, seed=1, max_frames=40)
    assert rate == 44100
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert out.frames > 0
    assert audio.shape == (out.frames * 2048,)
    assert out.codes.shape == (10, out.frames)
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0


def test_same_seed_same_audio_and_other_seed_differs(tiny_tts):
    a = tiny_tts.generate(TEXT, seed=7, max_frames=40)
    b = tiny_tts.generate(TEXT, seed=7, max_frames=40)
    c = tiny_tts.generate(TEXT, seed=8, max_frames=40)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.audio, b.audio)
    assert not np.array_equal(a.codes, c.codes)


def test_no_state_leaks_between_utterances(tiny_tts):
    fresh = tiny_tts.generate("A second, different sentence.", seed=3, max_frames=40)
    tiny_tts.generate(TEXT + " " + TEXT, seed=4, max_frames=60)
    after = tiny_tts.generate("A second, different sentence.", seed=3, max_frames=40)
    assert np.array_equal(fresh.codes, after.codes)


def test_frame_cap_is_reported(tiny_tts):
    out = tiny_tts.generate(TEXT, seed=1, max_frames=3)
    assert out.frames <= 3
    assert out.reached_eos or out.frames == 3
    assert out.max_frames == 3


def test_codes_match_the_sampler_ranges(tiny_tts):
    out = tiny_tts.generate(TEXT, seed=2, max_frames=40)
    cfg = tiny_tts.config
    assert ((out.codes >= 0) & (out.codes < cfg.codebook_size)).all()


@pytest.mark.parametrize("text", ["", "   \n\t ", "...!!", "—"])
def test_unspeakable_text_is_refused(tiny_tts, text):
    with pytest.raises(PromptError):
        tiny_tts.generate(text, seed=0)


def test_text_longer_than_the_context_is_refused_with_numbers(tiny_tts):
    with pytest.raises(PromptError, match=r"512"):
        tiny_tts.generate("word " * 600, seed=0)


def test_synthesize_splits_text_too_long_for_one_utterance_as_the_stream_does(tiny_tts):
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(16))  # ~620 tokens: over 512
    assert not tiny_tts.fits_one_utterance(text) and tiny_tts.fits_one_utterance(TEXT)
    with pytest.raises(PromptError, match="context"):
        tiny_tts.generate(text, seed=2, max_frames=5)
    from audio8_coreai.voices import Voice

    c = tiny_tts.config.num_codebooks
    damaged = Voice(np.full((c, 4), 10**6), "Hello there.", 44100, 0.2, tiny_tts.checkpoint.fingerprint(), "")
    with pytest.raises(PromptError, match="outside"):  # a damaged voice is named, not taken for long text
        tiny_tts.fits_one_utterance(TEXT, damaged)
    starts = []
    audio, rate = tiny_tts.synthesize(text, seed=2, max_frames=5, on_start=starts.append)
    speech = tiny_tts.stream(text, seed=2, max_frames=5, chunk_frames=4)
    assert len(speech.pieces) >= 2 and starts == [5 * len(speech.pieces)]
    assert rate == 44100
    np.testing.assert_allclose(audio, np.concatenate(list(speech)), rtol=0, atol=1e-5)


def test_a_frame_cap_beyond_the_context_names_the_piece_of_a_split_text(tiny_tts):
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(16))
    with pytest.raises(EngineError, match=r"piece 1 of \d+ \('Sentence 0 is here.*'\): the prompt is \d+ tokens"):
        tiny_tts.synthesize(text, seed=0, max_frames=10_000)


def test_explicit_frame_cap_beyond_the_context_is_refused(tiny_tts):
    with pytest.raises(EngineError, match=r"at most \d+ frames"):
        tiny_tts.generate(TEXT, seed=0, max_frames=10_000)


def test_prompt_heads_are_kept_and_give_the_same_state(tiny_tts):
    """The second prompt with a known head runs only its rest: the same logits and KV state as when the head
    was computed (bitwise), within float rounding of one sweep over the whole prompt, and the same audio."""
    backend = tiny_tts.backend
    backend.heads.clear()
    prompt = tiny_tts.prompts.plain(TEXT)
    head = tiny_tts.prompts.prefix_length(prompt)
    assert 0 < head < prompt.shape[1]
    computed = backend.prefill(prompt)
    k_computed = backend.k_cache[:, :, :, : prompt.shape[1]].clone()
    assert len(backend.heads.keys()) == 1
    kept = backend.prefill(prompt)
    assert np.array_equal(computed[0], kept[0]) and np.array_equal(computed[1], kept[1])
    assert torch.equal(backend.k_cache[:, :, :, : prompt.shape[1]], k_computed)
    backend.prefix_length = None  # one sweep, nothing kept
    try:
        sweep = backend.prefill(prompt)
    finally:
        backend.prefix_length = tiny_tts.prompts.prefix_length
    np.testing.assert_allclose(sweep[0], kept[0], rtol=0, atol=1e-3)  # int16 products, other windows
    assert np.array_equal(
        tiny_tts.generate(TEXT, seed=3, max_frames=12).audio, tiny_tts.generate(TEXT, seed=3, max_frames=12).audio
    )


def test_at_most_prefix_cache_heads_are_kept(tiny_tts):

    backend = tiny_tts.backend
    backend.heads.clear()
    codes = np.zeros((10, 2), np.int64)
    prompts = [
        tiny_tts.prompts.clone(TEXT, f"Voice number {i}.", codes) for i in range(DEFAULTS.torch.prefix_cache + 2)
    ]
    for p in prompts:  # a voice per transcript: each its own head
        backend.prefill(p)
    heads = [p[:, : tiny_tts.prompts.prefix_length(p)].tobytes() for p in prompts]
    assert backend.heads.keys() == heads[2:]  # the least recently used went first
    backend.prefill(tiny_tts.prompts.plain(TEXT))
    assert len(backend.heads.keys()) == DEFAULTS.torch.prefix_cache


def test_text_whose_speech_would_pass_the_frame_budget_is_split_not_cut(tiny_tts):
    """The prompt fits the context, the estimated speech does not fit the frame budget: synthesize splits it
    exactly as stream does (it used to run generate and stop at the cap)."""
    text = " ".join(["Words go here."] * 10)
    assert tiny_tts.prompts.plain(text).shape[1] < tiny_tts.config.max_seq_len  # one prompt would fit
    assert not tiny_tts.fits_one_utterance(text)
    speech = tiny_tts.stream(text, seed=3, max_frames=4, chunk_frames=16, first_chunk_frames=16)
    streamed = np.concatenate(list(speech))
    audio, _ = tiny_tts.synthesize(text, seed=3, max_frames=4)
    assert len(speech.pieces) >= 2 and np.array_equal(audio, streamed)


def test_every_error_class_is_an_audio8_error_and_exported(tiny_checkpoint, tiny_tts):
    import audio8_coreai
    from audio8_coreai.errors import AssetError, GateError, ParityError, QuantError, TokenizerError

    names = [n for n in audio8_coreai.__all__ if isinstance(getattr(audio8_coreai, n), type)]
    classes = [getattr(audio8_coreai, n) for n in names]
    exported = [c for c in classes if issubclass(c, Exception) and not issubclass(c, Warning)]
    assert len(exported) == 14  # every error a TTS call raises, subclasses included (PromptTooLong, VoiceExists...)
    assert {"PrecisionError", "PromptTooLong", "VoiceExists", "DamagedVoice", "VoiceStorageError", "NoAudio"} < set(
        names
    )
    for cls in exported + [AssetError, GateError, QuantError, ParityError, TokenizerError]:
        assert issubclass(cls, audio8_coreai.Audio8Error), cls
    with pytest.raises(audio8_coreai.Audio8Error, match="device must be a name"):
        audio8_coreai.TTS.load(tiny_checkpoint, device=None)
    with pytest.raises(audio8_coreai.Audio8Error, match="voices folder must be a path"):
        audio8_coreai.TTS.load(tiny_checkpoint, device="cpu", voices_dir=5)
    with pytest.raises(audio8_coreai.AudioError, match="must be a file path .*got ndarray"):
        tiny_tts.voice_from_clip(np.zeros(44100, np.float32), "Hello there.")


@pytest.mark.parametrize("codec_process", [True, False])
def test_loading_and_speaking_never_import_torch_dynamo(tiny_checkpoint, codec_process):
    """Building the model on the meta device draws no random init (model/layers.py Embedding): torch's Python
    reference of ``normal_`` would import ``torch._dynamo`` (seconds of every load) for values never used. A fresh
    process loads, speaks, streams and encodes a clip without importing it."""
    script = (
        "import sys, numpy as np\n"
        "from audio8_coreai import TTS\n"
        f"tts = TTS.load(sys.argv[1], device='cpu', codec_process={codec_process})\n"
        "tts.generate('Hello there.', seed=1, max_frames=3)\n"
        "list(tts.stream('Hello again.', seed=1, max_frames=3))\n"
        "tts.backend.encode(np.zeros(44100, dtype=np.float32))\n"
        "tts.close()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tiny_checkpoint)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_noise_drawn_ahead_gives_the_same_audio(tiny_checkpoint, monkeypatch):
    """A backend whose frames leave the host idle (CUDA) draws each step's noise during the step before, on the noise
    threads (every draw: the backend starts the next once it has launched a frame): the same seed gives the same
    codes, and the same audio for a stream of several pieces (one noise stream across them)."""
    import threading

    from audio8_coreai import TTS
    from audio8_coreai.sampling import NoiseSource

    drawn_on: list[str] = []
    draw = NoiseSource.next_frame

    def recorded(self):
        drawn_on.append(threading.current_thread().name.split("_")[0])
        return draw(self)

    monkeypatch.setattr(NoiseSource, "next_frame", recorded)

    plain = TTS.load(tiny_checkpoint, device="cpu", codec_process=False)
    ahead = TTS.load(tiny_checkpoint, device="cpu", codec_process=False)
    assert not plain.backend.noise_ahead
    ahead.backend.noise_ahead = True
    want = plain.generate(TEXT, seed=5, max_frames=20).codes
    steps = len(drawn_on)  # frames made, and the eos step if one came
    assert set(drawn_on) == {"MainThread"} and steps == want.shape[1] + (want.shape[1] < 20)
    drawn_on.clear()
    got = ahead.generate(TEXT, seed=5, max_frames=20).codes
    np.testing.assert_array_equal(got, want)
    assert set(drawn_on) == {"audio8-noise"} and len(drawn_on) == steps + 1  # and the step after the last, unused
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(3))
    streams = [tts.stream(text, seed=2, max_frames=5, chunk_frames=4) for tts in (plain, ahead)]
    assert [len(s.pieces) for s in streams] == [3, 3]
    want, got = (np.concatenate(list(s)) for s in streams)
    assert want.size > 0
    np.testing.assert_array_equal(got, want)


def test_a_clips_warnings_reach_the_python_caller_as_clip_warnings(tiny_tts, tmp_path):
    """A clip at 8 kHz clones less well: voice_from_clip, register_voice and generate with ref_audio each tell it as
    a ClipWarning naming the caller's line (it was only in ``Voice.warnings``); a clean clip tells nothing. Serving
    in the same process leaves them alone (the server says a clip's warnings in its answer, no filter set)."""
    import warnings

    import audio8_coreai.server.app  # noqa: F401
    from tests import clips

    low = clips.write(tmp_path / "low.wav", clips.bursts(8000, 2.0), 8000)
    clean = clips.write(tmp_path / "clean.wav", clips.bursts(24000, 2.0), 24000)
    calls = {
        "voice_from_clip": lambda clip: tiny_tts.voice_from_clip(clip, "Hello."),
        "register_voice": lambda clip: tiny_tts.register_voice(clip.stem, clip, "Hello.", store=tmp_path / "v"),
        "generate": lambda clip: tiny_tts.generate("Hi.", ref_audio=clip, ref_text="Hello.", seed=0, max_frames=2),
    }
    for name, call in calls.items():
        with pytest.warns(ClipWarning, match="8000 Hz") as told:
            call(low)
        assert len(told) == 1 and told[0].filename == __file__, (name, [str(w.message) for w in told])
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            call(clean)
        assert [w for w in told if issubclass(w.category, ClipWarning)] == [], name


@pytest.mark.parametrize("codec_process", [False, True])
def test_a_closed_model_speaks_no_more_wherever_its_codec_runs(tiny_checkpoint, codec_process):
    """After ``close`` (or its ``with`` block), every call that speaks raises BackendError before any frame: with the
    codec in this process it used to speak on, where the codec process's model failed at its first decode."""
    from audio8_coreai import TTS
    from audio8_coreai.errors import BackendError

    with TTS.load(tiny_checkpoint, device="cpu", codec_process=codec_process) as tts:
        assert tts.generate(TEXT, seed=1, max_frames=2).frames > 0 and not tts.closed
    assert tts.closed
    calls = {
        "generate": lambda: tts.generate(TEXT, seed=1, max_frames=2),
        "synthesize": lambda: tts.synthesize(TEXT, seed=1, max_frames=2),
        "stream": lambda: tts.stream(TEXT, seed=1, max_frames=2),
        "generate_batch": lambda: tts.generate_batch([TEXT], seeds=[1], max_frames=2),
        "batched": lambda: tts.batched(2),
    }
    for call in calls.values():
        with pytest.raises(BackendError, match=r"^this model was closed .*: load it again$"):
            call()


def test_a_stream_left_by_a_break_resumes_and_one_that_ended_starts_over(tiny_tts):
    """A ``for`` loop over a stream left by ``break`` and looped over again goes on where it stood, as a generator
    does (it started over: the first chunks were heard twice); once it has ended, a new loop starts over."""
    text = "Hello there, a stream read in two loops."
    whole = list(tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=2))
    stream = tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=2)
    got = []
    for chunk in stream:
        got.append(chunk)
        if len(got) == 2:
            break
    got.append(next(iter(stream)))  # the third chunk, not the first again
    got += list(stream)
    assert len(whole) > 3 and len(got) == len(whole) and all(np.array_equal(a, b) for a, b in zip(got, whole))
    again = list(stream)  # ended: a new loop starts over, the same audio
    assert len(again) == len(whole) and all(np.array_equal(a, b) for a, b in zip(again, whole))


def test_a_stream_closed_midway_frees_the_model_and_speaks_again_whole(tiny_tts):
    """``with tts.stream(...) as stream`` (or ``stream.close()``): the iteration ends where it stood, so the next
    utterance on the TTS runs (the closed stream is not overtaken: it is over) and the stream iterates again from
    the start, the same samples. Closed from its own on_frame, or from another thread, it ends at the next frame."""
    import threading

    text = "Hello there, a stream left midway."
    whole = np.concatenate(list(tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=2)))
    with tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=2) as stream:
        chunks = iter(stream)
        first = next(chunks)
    assert first.size > 0 and list(chunks) == []  # closed: nothing more comes
    assert tiny_tts.generate("Something else.", seed=1, max_frames=4).codes.shape[1] <= 4
    assert np.array_equal(np.concatenate(list(stream)), whole)
    stream.close()  # idempotent

    def close_at(step):
        if step == 4:
            stream.close()

    stream = tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=2, on_frame=close_at)
    audio = np.concatenate(list(stream))
    assert stream.frames == 4 and 0 < audio.size <= 4 * 2048 and np.array_equal(audio, whole[: audio.size])

    stream = tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=2, on_frame=lambda step: started.set())
    started = threading.Event()
    closer = threading.Thread(target=lambda: (started.wait(30), stream.close()))
    closer.start()
    made = list(stream)
    closer.join(30)
    audio = np.concatenate(made or [whole[:0]])
    assert stream.frames < 12 and np.array_equal(audio, whole[: audio.size])
