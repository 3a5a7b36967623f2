"""``audio8 wyoming``: the Wyoming server spoken to over loopback with the ``wyoming`` package's own client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from typer.testing import CliRunner
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from audio8_coreai import TTS, __version__
from audio8_coreai.audio import encode_speech
from audio8_coreai.cli import app
from audio8_coreai.server.wyoming_speaker import Speaker
from audio8_coreai.settings import DEFAULTS, WyomingSettings
from audio8_coreai.text import LANGUAGES
from audio8_coreai.text.split import complete_sentences
from tests.server.wyoming_support import FRAMES, HOP, PAUSE, SEED, free_port, make_voice, pcm, serving, spoken, talk


def test_describe_lists_the_own_voice_and_this_checkpoints_stored_voices(never_eos_tts):
    (events,) = talk(never_eos_tts, [Describe().event(), None])
    (program,) = Info.from_event(events[0]).tts
    assert program.name == "audio8" and program.installed and program.supports_synthesize_streaming
    assert program.description == f"{never_eos_tts.checkpoint.path.name} (audio8-coreai {__version__})"
    assert [v.name for v in program.voices] == [DEFAULTS.wyoming.voice, "ana"]  # not another's, not a damaged one
    assert all(v.languages == list(LANGUAGES) for v in program.voices)
    assert set(LANGUAGES) == {"en", "zh", "ja", "ko", "de", "fr", "es"}


def test_home_assistants_voice_picker_shows_each_voice_by_its_name(never_eos_tts):
    """Home Assistant (its wyoming tts entity) lists each voice under its description, per language, sorted: each
    starts with the voice's name, then what it is, so two voices cloned from clips of one length stay distinct."""
    never_eos_tts.voices.save(make_voice("bo", never_eos_tts.checkpoint.fingerprint()))  # ana's clip length
    try:
        (events,) = talk(never_eos_tts, [Describe().event(), None])
    finally:
        never_eos_tts.voices.remove("bo")
    (program,) = Info.from_event(events[0]).tts
    picker: dict[str, list[tuple[str, str]]] = {}  # language -> (voice_id, name), as Home Assistant builds it
    for voice in program.voices:
        for language in voice.languages if voice.installed else ():
            picker.setdefault(language, []).append((voice.name, voice.description or voice.name))
    expected = [
        ("ana", "ana: cloned from a 1.5 s clip"),
        (DEFAULTS.wyoming.voice, f"{DEFAULTS.wyoming.voice}: the model's own voice"),
        ("bo", "bo: cloned from a 1.5 s clip"),
    ]
    assert set(picker) == set(LANGUAGES)
    assert all(sorted(shown, key=lambda v: v[1]) == expected for shown in picker.values())


def test_synthesize_streams_the_samples_tts_gives_as_they_are_made(never_eos_tts):
    text = "Hello there."
    plain, own, ana = talk(  # three clients at once: the model speaks for one at a time, each gets its own audio
        never_eos_tts,
        [Synthesize(text).event(), None],
        [Synthesize(text, voice=SynthesizeVoice(DEFAULTS.wyoming.voice)).event(), None],
        [Synthesize(text, voice=SynthesizeVoice("ana")).event(), None],
    )
    assert pcm(plain) == pcm(own) == spoken(never_eos_tts, text)
    assert pcm(ana) == spoken(never_eos_tts, text, voice="ana") != pcm(plain)
    # chunks as the stream makes them: 1 frame, then 2 (the first chunk short, then doubling)
    assert [len(AudioChunk.from_event(e).audio) // 2 for e in plain[1:-1]] == [HOP, 2 * HOP]
    # the whole-utterance decode of the same draws, to the streaming codec's float rounding (one 16-bit step)
    whole = encode_speech(never_eos_tts.synthesize(text, seed=SEED, max_frames=FRAMES)[0], 44100, "pcm")
    assert np.abs(np.frombuffer(pcm(plain), "<i2") - np.frombuffer(whole, "<i2").astype(int)).max() <= 1


def test_streaming_speaks_each_sentence_and_ignores_the_compatibility_synthesize(never_eos_tts):
    (events,) = talk(
        never_eos_tts,
        [
            SynthesizeStart(voice=SynthesizeVoice("ana")).event(),
            SynthesizeChunk("Hello there. How").event(),
            SynthesizeChunk(" are").event(),
            SynthesizeChunk(" you?").event(),
            Synthesize("Hello there. How are you?", voice=SynthesizeVoice("ana")).event(),  # for older servers
            SynthesizeStop().event(),
            None,  # up to audio-stop
            None,  # synthesize-stopped
        ],
    )
    assert [e.type for e in events[-2:]] == ["audio-stop", "synthesize-stopped"]
    audio = pcm(events)
    assert len(audio) // 2 == 2 * FRAMES * HOP + PAUSE
    assert audio == spoken(never_eos_tts, "Hello there.", "How are you?", voice="ana")


def test_a_stream_of_no_words_ends_with_nothing_to_say_and_the_connection_serves_on(never_eos_tts):
    """An assistant's empty reply streamed (whitespace, punctuation): synthesize-stopped alone, no audio, no error;
    the next request on the connection is served."""
    (events,) = talk(
        never_eos_tts,
        [
            SynthesizeStart().event(),
            SynthesizeChunk("  ").event(),
            SynthesizeChunk(" ...").event(),
            SynthesizeStop().event(),
            None,  # synthesize-stopped
            SynthesizeStart().event(),
            SynthesizeChunk("Hi.").event(),
            SynthesizeStop().event(),
            None,  # up to audio-stop
            None,  # synthesize-stopped
        ],
    )
    assert events[0].type == "synthesize-stopped"
    assert [e.type for e in events[-2:]] == ["audio-stop", "synthesize-stopped"] and len(pcm(events[1:])) > 0


def test_a_new_stream_in_an_open_one_ends_the_open_one_whole_first(never_eos_tts):
    """synthesize-start inside an open stream: the open stream's unspoken text is spoken and its audio stopped,
    then the new stream runs (two audio-starts without an audio-stop came, and "And." was dropped)."""
    (events,) = talk(
        never_eos_tts,
        [
            SynthesizeStart().event(),
            SynthesizeChunk("Hello there. And.").event(),
            SynthesizeStart().event(),
            None,  # up to the first stream's audio-stop
            None,  # its synthesize-stopped
            SynthesizeChunk("Again.").event(),
            SynthesizeStop().event(),
            None,  # up to audio-stop
            None,  # synthesize-stopped
        ],
    )
    kinds = [e.type for e in events]
    first = kinds.index("synthesize-stopped") + 1
    assert kinds[first - 2 : first] == ["audio-stop", "synthesize-stopped"] and kinds[-1] == "synthesize-stopped"
    assert pcm(events[:first]) == spoken(never_eos_tts, "Hello there.", "And.")
    assert pcm(events[first:]) == spoken(never_eos_tts, "Again.")


def test_streaming_audio_comes_before_the_stream_ends(never_eos_tts):
    async def main() -> list[str]:
        seen = []
        async with serving(never_eos_tts) as port, AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk("One. Two").event())
            samples = 0
            while samples < FRAMES * HOP:  # all of "One." arrives while the stream is still open
                event = await asyncio.wait_for(client.read_event(), 60)
                seen.append(event.type)
                if AudioChunk.is_type(event.type):
                    samples += len(AudioChunk.from_event(event).audio) // 2
            await client.write_event(SynthesizeStop().event())
            while (event := await asyncio.wait_for(client.read_event(), 60)).type != "synthesize-stopped":
                seen.append(event.type)
        return seen

    seen = asyncio.run(main())
    assert seen[0] == "audio-start" and seen[-1] == "audio-stop" and seen.count("audio-stop") == 1
    assert seen.count("audio-chunk") == 2 + 1 + 2  # One.: 1+2 frames; the pause; Two: 1+2 frames


@pytest.mark.parametrize(
    ("text", "sentences", "rest"),
    [
        ("Hello there. How", ["Hello there."], " How"),
        ("Hello there. ", [], "Hello there. "),  # the next word decides: "Dr. " may go on
        ("Ask Dr. Smith. He", ["Ask Dr. Smith."], " He"),
        ("One. Two!  Three? Fo", ["One.", "Two!", "Three?"], " Fo"),
        ("... Yes. No", ["... Yes."], " No"),  # marks alone ride with the next sentence
        ("你好。世界", ["你好。"], "世界"),
        ("pi is 3.14 or so", [], "pi is 3.14 or so"),
        ("好的.你觉得呢?好", ["好的.", "你觉得呢?"], "好"),  # CJK typed with half-width marks
        ("円周率は３．１４です。次", ["円周率は３．１４です。"], "次"),  # a full-width point in a number
        ("e.g.東京とMr.田中さん。次", ["e.g.東京とMr.田中さん。"], "次"),  # a Latin word's point goes on
        ("はい。", ["はい。"], ""),  # a full-width end is one at once
        ("本当？ええ！ ", ["本当？", "ええ！"], " "),
        ("Done?\n\n", ["Done?"], ""),  # a paragraph ends what is before it
        ("A list:\n1. Apples.\n2. Pears\n", ["A list:", "1. Apples."], "2. Pears\n"),  # a list number is no end
        ("Buy:\n- milk\n- eggs", ["Buy:", "- milk"], "- eggs"),
        ("Steps:\n   1. First step. More", ["Steps:", "1. First step."], " More"),  # an indented item too
        ("他说：「你好。」", ["他说：「你好。」"], ""),  # a closing bracket after the end
        ("1. First item\n", [], "1. First item\n"),  # the line break kept: the next line decides
        ("The meeting was\nmoved. Next", ["The meeting was moved."], " Next"),  # a wrapped line goes on
        ("---\n\nHi. There", ["Hi."], " There"),  # marks alone before a break are not spoken
        (" 1. First step then more. And", ["1. First step then more."], " And"),  # a number after a sentence's end
        ("他走了。“再见", ["他走了。"], "“再见"),  # a Chinese opening quote goes with what follows
        ("Er sagte: „Es regnet.“ Am", ["Er sagte: „Es regnet.“"], " Am"),  # a German closing quote with its end
    ],
)
def test_complete_sentences_of_growing_text(text, sentences, rest):
    assert complete_sentences(text) == (sentences, rest)


@pytest.mark.parametrize(
    ("events", "code", "needle"),
    [
        ([Synthesize("").event()], "PromptError", "empty"),
        ([Synthesize(" ... ").event()], "PromptError", "no letters or digits"),
        ([Synthesize("Hi.", voice=SynthesizeVoice("nobody")).event()], "VoiceError", "the model's own is 'audio8'"),
        ([Synthesize("Hi.", voice=SynthesizeVoice("broken")).event()], "DamagedVoice", "'broken' is damaged"),
        ([Synthesize("Hi.", voice=SynthesizeVoice("stranger")).event()], "VoiceError", "another checkpoint"),
        ([Synthesize("x" * 41).event()], "ConfigError", "speaks at most 40 at once: add punctuation or spaces"),
        ([Synthesize(" ." * 30).event()], "PromptError", "no letters or digits"),
        ([Event("synthesize", {"voice": {}})], "ProtocolError", "synthesize event: it needs its 'text' field"),
        ([Event("synthesize", {"text": 5})], "ProtocolError", "synthesize's text must be a string, got int"),
        ([SynthesizeChunk("Hi.").event()], "ProtocolError", "without synthesize-start"),
        ([SynthesizeStop().event()], "ProtocolError", "without synthesize-start"),
        ([SynthesizeStart().event(), SynthesizeChunk("x" * 41).event()], "ConfigError", "without a sentence end"),
    ],
)
def test_bad_requests_get_an_error_event_then_the_end_of_the_connection(never_eos_tts, events, code, needle):
    settings = WyomingSettings(seed=SEED, max_frames=FRAMES, max_input_chars=40)
    received, other = talk(never_eos_tts, [*events, None], [Describe().event(), None], settings=settings)
    error = Error.from_event(received[0])
    assert error.code == code and needle in error.text, error
    assert "Traceback" not in error.text and "/" not in error.text.replace("synthesize-start", "")
    assert received[1:] == [None]  # closed: a client waiting for audio-stop does not wait for ever
    assert other[0].type == "info"  # the server goes on


def test_a_text_over_the_cap_is_spoken_in_parts_cut_at_sentence_ends(never_eos_tts):
    """A plain synthesize over ``max_input_chars`` (a long reply from a client that does not stream): one audio,
    its parts (at most 40 characters, cut at sentence ends and joined while they fit) spoken in turn with the
    server's seed, joined by the stream's pause."""
    settings = WyomingSettings(seed=SEED, max_frames=FRAMES, max_input_chars=40)
    text = "Hello there, my friend. How are you today? I am fine, thanks."
    (received,) = talk(never_eos_tts, [Synthesize(text).event(), None], settings=settings)
    parts = ["Hello there, my friend.", "How are you today? I am fine, thanks."]  # sentences joined while they fit
    assert pcm(received) == spoken(never_eos_tts, *parts)


def test_a_client_that_leaves_stops_its_utterance(never_eos_tts, monkeypatch):
    steps = []
    stream = never_eos_tts.stream

    def counted(*args, on_frame, **kwargs):
        return stream(*args, on_frame=lambda step: (steps.append(step), on_frame(step)), **kwargs)

    monkeypatch.setattr(never_eos_tts, "stream", counted)

    async def main() -> None:
        async with serving(never_eos_tts, WyomingSettings(seed=SEED, max_frames=300)) as port:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Synthesize("Hello.").event())
                assert (await client.read_event()).type == "audio-start"
            made = -1
            while made != len(steps):  # until no frame came for half a second
                made = len(steps)
                await asyncio.sleep(0.5)

    asyncio.run(main())
    assert 1 <= len(steps) < 100  # of the 300 the cap allows


def test_a_bug_is_an_error_event_without_its_details(never_eos_tts, monkeypatch):
    def broken(self):
        raise RuntimeError("at /some/server/path")

    monkeypatch.setattr(Speaker, "info", broken)
    received, other = talk(never_eos_tts, [Describe().event(), None], [Synthesize("Hi.").event(), None])
    error = Error.from_event(received[0])
    assert error.code == "server_error" and "RuntimeError" in error.text and "/some" not in error.text
    assert received[1:] == [None]
    assert pcm(other) == spoken(never_eos_tts, "Hi.")  # the server goes on


def test_an_utterance_ending_at_once_is_a_no_audio_error(eos_first_checkpoint):
    tts = TTS.load(eos_first_checkpoint, device="cpu")
    one, streamed = talk(
        tts,
        [Synthesize("Hello.").event(), None],
        [SynthesizeStart().event(), SynthesizeChunk("Hello. Bye.").event(), SynthesizeStop().event(), None],
        settings=WyomingSettings(seed=SEED, top_k=1),  # top-k 1: eos on the first frame (steered.py)
    )
    assert [e and e.type for e in one] == [e and e.type for e in streamed] == ["error", None]
    assert Error.from_event(one[0]).code == Error.from_event(streamed[0]).code == "no_audio"


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--max-frames", "0"], "--max-frames must be >= 1"), (["--seed", "-1"], "seed"), (["--port", "0"], "--port")],
)
def test_cli_options_are_checked_before_loading(args, needle, tmp_path):
    result = CliRunner().invoke(app, ["wyoming", "--model", str(tmp_path / "absent"), *args])
    assert result.exit_code == 2 and needle in result.output, result.output


def test_the_command_serves_describe_and_synthesize(never_eos_checkpoint, tmp_path):
    port = free_port()
    command = [sys.executable, "-m", "audio8_coreai.cli", "wyoming", "--model", str(never_eos_checkpoint)]
    command += ["--port", str(port), "--device", "cpu", "--voices", str(tmp_path), "--max-frames", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy())

    async def ask() -> list[Event]:
        deadline = time.monotonic() + 300  # a loaded machine takes its time to import torch and load
        while time.monotonic() < deadline:
            try:
                async with AsyncTcpClient("127.0.0.1", port) as client:
                    await client.write_event(Describe().event())
                    info = await asyncio.wait_for(client.read_event(), 60)
                    await client.write_event(Synthesize("Hi.").event())
                    events = [info]
                    while (event := await asyncio.wait_for(client.read_event(), 60)).type != "audio-stop":
                        events.append(event)
                    return [*events, event]
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(proc.stdout.read().decode()) from None
                time.sleep(0.1)
        raise AssertionError("the server did not listen")

    try:
        events = asyncio.run(ask())
    finally:
        proc.terminate()
        try:
            proc.wait(60)  # a loaded machine may take a while to deliver the signal and unwind
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert [v.name for v in Info.from_event(events[0]).tts[0].voices] == [DEFAULTS.wyoming.voice]
    assert len(pcm(events[1:])) == 2 * HOP  # one frame of 16-bit samples
