"""The frame cap follows the text: a model that never samples eos stops a few seconds after the words' allowance
(settings.py: cap_base_frames + cap_frames_per_token per text token) wherever a budget is made (generate, so the
CLI; stream, so the server; batches); an explicit max_frames, the checkpoint's max_new_tokens and the context
still apply."""

from __future__ import annotations

import pytest

from audio8_coreai import TTS
from audio8_coreai.settings import DEFAULTS


@pytest.fixture(scope="module")
def never_eos_512(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint that never draws eos, keeping its 512-position context: room for the text's cap."""
    from tests.steered import steer_eos

    return steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "never_eos_512", "never")


@pytest.fixture(scope="module")
def never_eos_tts(never_eos_512):
    return TTS.load(never_eos_512, device="cpu")


def _cap(tokens: int) -> int:
    return DEFAULTS.speech.cap_base_frames + DEFAULTS.speech.cap_frames_per_token * tokens


def test_the_rule_is_three_seconds_and_a_fraction_per_token():
    """The documented numbers: 64 frames (3.0 s) plus 16 frames (0.74 s) per text token."""
    assert (DEFAULTS.speech.cap_base_frames, DEFAULTS.speech.cap_frames_per_token) == (64, 16)
    assert _cap(3) == 112


def test_a_short_text_stops_at_its_cap_not_at_the_checkpoints(never_eos_tts):
    tts = never_eos_tts
    assert len(tts.prompts.encode("Hi")) == 2  # the tiny byte-level tokenizer: a token a byte
    out = tts.generate("Hi", seed=1)
    assert (out.frames, out.max_frames, out.reached_eos) == (_cap(2), _cap(2), False) == (96, 96, False)
    assert out.frames < tts.checkpoint.generation.max_new_tokens  # 512: what it ran to before
    assert tts.stream("Hi", seed=1).max_frames == _cap(2)  # streamed (and so served) the same
    assert tts.stream("Hi. How are you?", seed=1).max_frames == _cap(16)


def test_each_text_of_a_batch_gets_its_own_cap(eos_first_checkpoint):
    """Each utterance's cap (its ``max_frames``) follows its own text; top-k 1 on this checkpoint ends each at once."""
    outs = TTS.load(eos_first_checkpoint, device="cpu").generate_batch(["A", "Hi"], seeds=[1, 2], top_k=1)
    assert [o.max_frames for o in outs] == [_cap(1), _cap(2)] == [80, 96]


def test_an_explicit_max_frames_is_the_callers_cap(never_eos_tts):
    assert never_eos_tts.stream("Hi.", seed=1, max_frames=150).max_frames == 150  # over the text's cap: asked for
    assert never_eos_tts.stream("Hi.", seed=1, frame_cap=40).max_frames == 40  # a server's ceiling still clips it


def test_the_context_still_caps_a_short_text(never_eos_checkpoint):
    """Context 128: the prompt of "Hi." leaves fewer frames than its text cap, so the context decides."""
    tts = TTS.load(never_eos_checkpoint, device="cpu")
    room = 128 - tts.prompts.plain("Hi.").shape[1]
    assert room < _cap(3)
    assert tts.stream("Hi.", seed=1).max_frames == room


def test_the_loop_refuses_frames_past_the_context_before_any_work(never_eos_checkpoint):
    """A tool's prompt and frame cap meet the loop's one guard (:class:`Utterance`): generate and a batch's admit
    refuse it with the numbers before a prefill or a row is taken."""
    from audio8_coreai.config import SamplingParams
    from audio8_coreai.engine.batch import BatchEngine
    from audio8_coreai.engine.loop import generate
    from audio8_coreai.errors import EngineError

    tts = TTS.load(never_eos_checkpoint, device="cpu")
    prompt = tts.prompts.plain("Hi.")
    room, params = 128 - prompt.shape[1], SamplingParams()
    tts.backend.k_cache.fill_(1.0)
    with pytest.raises(EngineError, match=rf"prompt {prompt.shape[1]} \+ {room + 1} frames exceeds the context 128"):
        generate(tts.backend, prompt, params, seed=1, max_frames=room + 1)
    assert bool((tts.backend.k_cache == 1.0).all())  # no prefill ran
    engine = BatchEngine(tts.backend, params, 2)
    with pytest.raises(EngineError, match="exceeds the context 128"):
        engine.admit(prompt, room + 1, seed=1)
    assert engine.free == 2 and not engine.items
    assert generate(tts.backend, prompt, params, seed=1, max_frames=room).frames == room  # the room fits


def test_the_loop_refuses_a_prompt_cap_or_seed_it_cannot_run(never_eos_checkpoint):
    """What a tool may hand the loop directly, each a clear error naming it before any work (a 0 or -3 cap ran one
    frame; None, a 1-D or empty prompt, an id past the vocabulary and a seed of -1 were tracebacks)."""
    import numpy as np

    from audio8_coreai.config import SamplingParams
    from audio8_coreai.engine.batch import BatchEngine
    from audio8_coreai.engine.loop import generate
    from audio8_coreai.errors import ConfigError, EngineError

    tts = TTS.load(never_eos_checkpoint, device="cpu")
    cfg, prompt, params = tts.backend.cfg, tts.prompts.plain("Hi."), SamplingParams()
    for cap, said in ((0, "max_frames must be >= 1, got 0"), (-3, "got -3"), (None, "whole number, got None")):
        with pytest.raises(ConfigError, match=said):
            generate(tts.backend, prompt, params, seed=1, max_frames=cap)
    bad_ids = prompt.copy()
    bad_ids[0, 0] = cfg.vocab_size
    prompts = {
        f"shape [{prompt.shape[1]}]": prompt[0],
        f"shape [{cfg.num_codebooks + 1}, 0]": prompt[:, :0],
        "got ndarray float32": prompt.astype(np.float32),
        f"ids are below {cfg.vocab_size}": bad_ids,
    }
    for said, wrong in prompts.items():
        with pytest.raises(EngineError, match=rf"a prompt is an integer array \[{cfg.num_codebooks + 1}, columns\]"):
            generate(tts.backend, wrong, params, seed=1, max_frames=2)
        with pytest.raises(EngineError, match=said.replace("[", r"\[").replace("]", r"\]")):
            BatchEngine(tts.backend, params, 1).admit(wrong, 2, seed=1)
    with pytest.raises(ConfigError, match="seed must be >= 0, got -1"):
        generate(tts.backend, prompt, params, seed=-1, max_frames=2)
