"""A request is checked once (request.check_request) and planned once (TTS.plan): `audio8 say`, the HTTP server and
the keyword API read a stored voice once, check and tokenise the text once, and speak the plan without checking it
again. Counted through the package's own seams on the checkpoint that never draws eos (steered.py), so every
utterance runs to its frame cap and the counts of frames are certain."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import warnings
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

import audio8_coreai.cli  # noqa: F401  (imported before the spies: every module's own name for check_text)
import audio8_coreai.server.app  # noqa: F401
from audio8_coreai import TTS, UnsupportedLanguageWarning, Voice
from audio8_coreai.cli import app
from audio8_coreai.errors import EngineError
from audio8_coreai.request import check_request
from audio8_coreai.settings import DEFAULTS
from audio8_coreai.text import PromptBuilder, check_text
from audio8_coreai.voices import VoiceStore

TEXT = "Nice to meet you, Ana."
TRANSCRIPT = "Hello there."
FRAMES = 6


@pytest.fixture(scope="module")
def voices(never_eos_long_checkpoint, tmp_path_factory):
    """A voice store holding ``ana``, made for the never-eos checkpoint (random codes: the counts, not the sound)."""
    from audio8_coreai.checkpoint import load_checkpoint

    fingerprint = load_checkpoint(never_eos_long_checkpoint).fingerprint()
    codes = np.random.default_rng(0).integers(0, 128, (10, 5))
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.save(Voice(codes, TRANSCRIPT, 44100, 0.23, fingerprint, "2026-01-01T00:00:00+00:00", "ana"))
    return store.root


@pytest.fixture(scope="module")
def tts(never_eos_long_checkpoint, voices):
    return TTS.load(never_eos_long_checkpoint, device="cpu", voices_dir=voices, codec_process=False)


class Counts:
    """What the package did during a test: ``voices_read`` (names read from a voice store), ``encoded`` (segments
    tokenised by a PromptBuilder, template segments at load included), ``checked`` (texts passed to check_text,
    with what they were checked as), ``plans`` (TTS.plan calls)."""

    def __init__(self):
        self.voices_read: list[str] = []
        self.encoded: Counter[str] = Counter()
        self.checked: list[tuple[str, str]] = []
        self.plans = 0


@pytest.fixture
def counts(monkeypatch) -> Counts:
    """Spies on the voice store's read, the prompt builder's tokeniser, every module's check_text and TTS.plan."""
    seen = Counts()
    load, encode, plan = VoiceStore.load, PromptBuilder.encode, TTS.plan

    def reading(store, name, *args, **kwargs):
        seen.voices_read.append(name)
        return load(store, name, *args, **kwargs)

    def encoding(builder, segment):
        seen.encoded[segment] += 1
        return encode(builder, segment)

    def checking(text, what="text", field=None):
        seen.checked.append((text, what))
        return check_text(text, what, field)

    def planning(self, *args, **kwargs):
        seen.plans += 1
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(VoiceStore, "load", reading)
    monkeypatch.setattr(PromptBuilder, "encode", encoding)
    monkeypatch.setattr(TTS, "plan", planning)
    for name, module in list(sys.modules.items()):
        if name.startswith("audio8_coreai") and getattr(module, "check_text", None) is check_text:
            monkeypatch.setattr(module, "check_text", checking)
    return seen


def texts_checked(counts: Counts) -> list[str]:
    """What ``TEXT`` was checked as, in order."""
    return [what for text, what in counts.checked if text == TEXT]


@pytest.mark.parametrize("streamed", [False, True])
def test_say_reads_the_voice_checks_and_tokenises_the_text_once(
    never_eos_long_checkpoint, voices, tmp_path, counts, streamed
):
    out = tmp_path / "ana.wav"
    args = ["say", TEXT, "-o", str(out), "--voice", "ana", "--voices", str(voices), "--model"]
    args += [str(never_eos_long_checkpoint), "--seed", "3", "--max-frames", str(FRAMES), "--device", "cpu"]
    result = CliRunner().invoke(app, [*args, "--no-codec-process", *(["--stream"] if streamed else [])])
    assert result.exit_code == 0, result.output
    assert f"{FRAMES} frames" in result.output and "voice 'ana'" in " ".join(result.output.split())
    assert sf.info(out).frames == FRAMES * 2048
    assert counts.voices_read == ["ana"]  # before loading, not again by the plan or the stream
    assert counts.plans == 1
    assert texts_checked(counts) == ["text"]  # by check_request alone
    assert counts.encoded[TEXT] == 1  # the plan's one tokenisation: pieces, prompt, frame cap
    assert counts.encoded["<|speaker:0|>" + TRANSCRIPT] == 1  # the voice's prompt head, built once


def test_a_server_request_is_checked_tokenised_and_planned_once(tts, counts):
    """One streamed request (OpenAI's sse events): the schema and check_request check the text, the worker plans
    it once, and the usage the last event reports is the plan's token count, not a second tokenisation."""
    from fastapi.testclient import TestClient

    from audio8_coreai.server.app import create_app

    tokens = len(tts.prompts.tokenizer.encode(TEXT, add_special_tokens=False).ids)  # not through the spy
    body = {"model": "audio8", "input": TEXT, "voice": "ana", "seed": 4, "max_frames": FRAMES}
    with TestClient(create_app([tts])) as client:
        counts.voices_read.clear()  # the app's start-up checks of the store
        r = client.post("/v1/audio/speech", json={**body, "response_format": "pcm", "stream_format": "sse"})
    assert r.status_code == 200, r.text
    events = [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert {k: v for k, v in events[-1].items() if k != "audio8_frame_cap"} == {  # its frame-cap note: another test's
        "type": "speech.audio.done",
        "usage": {"input_tokens": tokens, "output_tokens": FRAMES, "total_tokens": tokens + FRAMES},
    }
    assert counts.voices_read == ["ana"]  # by the route, before a worker is taken
    assert counts.plans == 1
    assert texts_checked(counts) == ["input"]  # by check_request alone, named as the body names it
    assert counts.encoded[TEXT] == 1
    assert counts.encoded["<|speaker:0|>" + TRANSCRIPT] == 1


def test_the_keyword_api_is_check_request_then_one_plan(tts, counts):
    out = tts.generate(TEXT, voice="ana", seed=5, max_frames=FRAMES)
    assert out.frames == FRAMES and out.max_frames == FRAMES and out.seed == 5
    assert counts.voices_read == ["ana"] and counts.plans == 1
    assert texts_checked(counts) == ["text"] and counts.encoded[TEXT] == 1


def test_a_plan_holds_what_its_speech_is_made_of(tts):
    """The plan of a text too long for one utterance: its pieces in order (their texts rejoined are the text), each
    prompt the clone prompt of its piece with its frame cap, the token count of the whole text; the stream speaks
    exactly those caps, and the same plan speaks the same audio twice."""
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(12))
    voice = tts.voices.load("ana")
    plan = tts.plan(check_request(text, voice="ana", seed=2, max_frames=3, temperature=0.5, chunk_frames=4))
    assert len(plan.pieces) > 1 and " ".join(p.text for p in plan.pieces) == text
    assert plan.voice.name == "ana" and np.array_equal(plan.voice.codes, voice.codes)
    assert plan.seed == 2 and plan.warning is None
    assert plan.tokens == len(tts.prompts.encode(text))
    assert (plan.params.temperature, plan.params.top_k) == (0.5, tts.checkpoint.generation.top_k)
    assert (plan.chunk_frames, plan.first_chunk_frames) == (4, min(DEFAULTS.speech.first_chunk_frames, 4))
    for piece in plan.pieces:
        assert np.array_equal(piece.prompt, tts.prompts.clone(piece.text, voice.transcript, voice.codes))
        assert piece.max_frames == 3 and piece.prompt is not piece.prompt  # built when read: no piece holds one
    assert plan.max_frames == 3 * len(plan.pieces)
    speech = tts.stream(plan)
    first = np.concatenate(list(speech))
    assert speech.frames == plan.max_frames and speech.reached_eos == [False] * len(plan.pieces)
    assert np.array_equal(np.concatenate(list(tts.stream(plan))), first)
    with pytest.raises(EngineError, match=rf"this plan holds {len(plan.pieces)} pieces"):
        tts.generate(plan)
    with pytest.raises(TypeError, match="a Plan holds its request.*seed"):
        tts.stream(plan, seed=3)
    whole = tts.plan(check_request(text, seed=2, max_frames=3), split=False)  # generate's: one piece
    assert len(whole.pieces) == 1 and whole.pieces[0].text == text


def test_plans_speak_in_a_batch(tts):
    """generate_batch takes plans of one piece sharing their sampling settings: each utterance its plan's seed and
    cap (the never-eos checkpoint runs each to it)."""
    plans = [tts.plan(check_request(t, seed=s, max_frames=f), split=False) for t, s, f in [(TEXT, 1, 4), ("Hi.", 2, 6)]]
    out = tts.generate_batch(plans)
    assert [(o.seed, o.frames, o.max_frames) for o in out] == [(1, 4, 4), (2, 6, 6)]
    hotter = tts.plan(check_request("Hi.", temperature=0.9), split=False)
    with pytest.raises(ValueError, match="share their sampling settings"):
        tts.generate_batch([plans[0], hotter])
    with pytest.raises(TypeError, match="a Plan holds its request.*seed"):
        tts.generate_batch(plans, seeds=[1, 2])
    split = tts.plan(check_request(" ".join(f"Sentence {i} is here, it keeps going." for i in range(12))))
    n = len(split.pieces)
    assert n > 1
    with pytest.raises(EngineError, match=rf"plans of one piece; texts\[1\]'s has {n}: plan with split=False"):
        tts.generate_batch([plans[0], split])


def test_the_language_warning_is_data_of_the_plan(tts):
    """Planned and spoken, text outside the model's languages raises no Python warning: the plan carries the line
    for its caller to tell. The keyword API tells it as an UnsupportedLanguageWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = tts.plan(check_request("Привет, как дела?", seed=1, max_frames=2))
        assert tts.generate(plan).frames == 2
    assert plan.warning is not None and "Cyrillic" in plan.warning
    with pytest.warns(UnsupportedLanguageWarning, match="Cyrillic") as caught:
        tts.generate("Привет, как дела?", seed=1, max_frames=2)
    assert len(caught) == 1 and caught[0].filename == __file__  # pointing at the caller's line


def test_a_plan_is_made_of_a_checked_request_and_spoken_by_its_own_checkpoint(tts, tiny_checkpoint):
    """plan refuses what is no checked request, saying how to make one; a plan made on one checkpoint is refused by
    a model of another (its voice and prompts hold for the one it was made on)."""
    for given in ("Hi.", {"text": "Hi."}):
        with pytest.raises(TypeError, match=r"plan takes a checked request.*check_request\(text"):
            tts.plan(given)
    plan = tts.plan(check_request(TEXT, voice="ana", seed=1, max_frames=2), split=False)
    assert plan.checkpoint == tts.checkpoint.fingerprint()
    other = TTS.load(tiny_checkpoint, device="cpu", codec_process=False)
    assert other.checkpoint.fingerprint() != plan.checkpoint
    for speak in (other.generate, other.stream, other.synthesize):
        with pytest.raises(EngineError, match="this plan was made for another checkpoint"):
            speak(plan)


def test_a_stored_voice_whose_codes_do_not_fit_the_model_is_damaged_by_name(tts):
    """A hand-edited file (five codebooks, its meta saying none) passes the store's checks; its prompt is refused as
    the voice's damage, by name and with the remedy (it said "reference codes must have shape [10, frames]")."""
    from audio8_coreai.errors import DamagedVoice, PromptError

    codes = np.zeros((5, 65), np.int64)
    edited = Voice(codes, TRANSCRIPT, 44100, 1.5, tts.checkpoint.fingerprint(), "2026-01-01T00:00:00+00:00", "cb0")
    with pytest.raises(DamagedVoice, match=r"voice 'cb0' is damaged \(.*shape \[10, frames\].*audio8 voice rm cb0"):
        tts.plan(check_request(TEXT, voice=edited))
    with pytest.raises(PromptError, match=r"shape \[10, frames\]") as e:  # a one-off voice's codes: the caller's
        tts.plan(check_request(TEXT, voice=dataclasses.replace(edited, name="")))
    assert not isinstance(e.value, DamagedVoice)


def test_a_context_too_small_for_any_words_is_said_with_its_numbers(tiny_checkpoint, tmp_path):
    """Context 33: the prompt around the text leaves no room; the refusal gives the positions (it said an
    utterance 'can hold -4 tokens' and guessed at a voice)."""
    from audio8_coreai.errors import PromptError
    from tests.steered import steer_eos

    small = TTS.load(steer_eos(tiny_checkpoint, tmp_path / "small", "never", max_seq_len=33), device="cpu")
    with pytest.raises(PromptError, match=r"no room for text: the prompt around it takes \d+ of the context's 33") as e:
        small.plan(check_request("Hello."))
    assert not re.search(r"-\d", str(e.value)) and "voice" not in str(e.value)  # no negative count


def test_the_sampling_a_request_sets_none_of_is_what_assets_bake_in():
    """Core AI frame graphs bake their sampling in: a request that sets none draws with it, whatever the checkpoint's
    generation_config.json says now (greedy included); greedy assets and a backend that bakes nothing change nothing."""
    from audio8_coreai.config import GenerationConfig, SamplingParams
    from audio8_coreai.plan import sampling_defaults

    checkpoint = GenerationConfig(do_sample=False, temperature=0.55, top_k=7, top_p=0.5, max_new_tokens=99)
    got = sampling_defaults(checkpoint, SamplingParams(temperature=0.7, top_k=50, top_p=0.9))
    assert (got.do_sample, got.temperature, got.top_k, got.top_p, got.max_new_tokens) == (True, 0.7, 50, 0.9, 99)
    assert sampling_defaults(checkpoint, SamplingParams(do_sample=False)) == checkpoint
    assert sampling_defaults(checkpoint, None) == checkpoint
