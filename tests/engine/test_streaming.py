"""Streaming: the exact incremental codec, TTS.stream (chunks, long text, isolation), the text splitter and
`audio8 say --stream`."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from audio8_coreai.cli import app
from audio8_coreai.config import CodecConfig
from audio8_coreai.errors import PromptError
from audio8_coreai.model.codec import CodecDecoder, StreamingDecoder
from audio8_coreai.settings import DEFAULTS
from audio8_coreai.text import split_text

EXACT = 1e-5  # the bar: streamed samples equal the whole-utterance decode's at fp32
TEXT = "The meeting has been moved to Thursday afternoon."
FRAMES = 144  # past the oracle codec's 128-frame window; 18 windows of the deep test codec
SPLITS = {"even": [16] * 9, "ragged": [1, 7, 16, 33, 2, 60, 25]}


@pytest.fixture(scope="module")
def endless_tts(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint that never draws eos (steered.py), its full context: an utterance runs to its frame cap
    whatever the seed."""
    from audio8_coreai import TTS
    from tests.steered import steer_eos

    return TTS.load(steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "never_eos", "never"), device="cpu")


@pytest.fixture(scope="module")
def oracle_decoder(oracle_dir: Path) -> CodecDecoder:
    cfg = CodecConfig.from_spec(json.loads((oracle_dir / "codec_spec.json").read_text()))
    sd = torch.load(oracle_dir / "codec.pth", weights_only=True, map_location="cpu")
    return CodecDecoder.from_state_dict(cfg, sd, max_frames=FRAMES)


@pytest.fixture(scope="module")
def deep_decoder(oracle_decoder: CodecDecoder) -> CodecDecoder:
    """The oracle codec with a 3-layer, window-8 post transformer (each layer the oracle's one): like the 0.6b
    codec, stacked layers see further back than one window, and an utterance spans many windows."""
    qt = dataclasses.replace(oracle_decoder.cfg.quantizer_transformer, n_layer=3, window_size=8)
    deep = CodecDecoder(dataclasses.replace(oracle_decoder.cfg, quantizer_transformer=qt), max_frames=FRAMES)
    src = oracle_decoder.state_dict()
    deep.load_state_dict({k: src[re.sub(r"(post_module\.layers\.)\d+", r"\g<1>0", k)] for k in deep.state_dict()})
    return deep.eval().requires_grad_(False)


_WHOLE: dict[str, torch.Tensor] = {}


def _whole(name: str, decoder: CodecDecoder) -> torch.Tensor:
    """The whole-utterance decode of ``_codes(FRAMES)`` (the reference), made once per decoder."""
    if name not in _WHOLE:
        with torch.no_grad():
            _WHOLE[name] = decoder(_codes(FRAMES))
    return _WHOLE[name]


def _codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 128, (1, 10, frames), generator=torch.Generator().manual_seed(seed))


def _streamed(decoder: CodecDecoder, codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    stream, pieces, start = StreamingDecoder(decoder), [], 0
    for n in sizes:
        pieces.append(stream.push(codes[..., start : start + n]))
        assert pieces[-1].shape == (1, n * decoder.cfg.frame_length)
        start += n
    return torch.cat(pieces, dim=-1)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("which", ["oracle_decoder", "deep_decoder"])
def test_streaming_decode_equals_the_whole_utterance(request, which, split):
    decoder = request.getfixturevalue(which)
    assert float((_streamed(decoder, _codes(FRAMES), SPLITS[split]) - _whole(which, decoder)).abs().max()) <= EXACT


def test_re_decoding_a_window_of_context_is_not_exact(deep_decoder):
    """Why the decoder keeps each layer's keys: re-decoding every chunk with one window of context (what a
    single-layer transformer would allow) misses what the stacked layers carry from further back."""
    codes, window, chunk = _codes(FRAMES), 8, 16
    whole = _whole("deep_decoder", deep_decoder)
    with torch.no_grad():
        pieces = [
            deep_decoder(codes[..., max(0, s - window) : s + chunk])[..., min(s, window) * 2048 :]
            for s in range(0, FRAMES, chunk)
        ]
    assert float((torch.cat(pieces, dim=-1) - whole).abs().max()) > 2 * EXACT


@pytest.mark.parametrize("which", ["oracle_decoder", "deep_decoder"])
def test_static_form_with_padded_pushes_equals_the_whole_utterance(request, which):
    """``push_static``, the Core AI decoder asset's form: fixed 16-frame pushes of which the first ``count`` are
    real (the rest any codes), the state in fixed tensors written in place; the real frames' samples are the
    whole-utterance decode's, past the transformer's window too (deep: 3 layers of window 8)."""
    decoder = request.getfixturevalue(which)
    stream, codes = StreamingDecoder(decoder), _codes(FRAMES)
    state = {name: torch.zeros(shape) for name, shape in stream.state_layout().items()}
    pieces, start = [], 0
    for n in [1, 2, 4, 8] + [16] * 7 + [13]:  # the last push starts at 127: its 16 RoPE rows fit FRAMES
        push = _codes(16, seed=n)
        push[..., :n] = codes[..., start : start + n]
        with torch.no_grad():
            wav = stream.push_static(push, torch.tensor([start]), torch.tensor([n]), state)
        assert wav.shape == (1, 16 * 2048)
        pieces.append(wav[:, : n * 2048])
        start += n
    whole = _whole(which, decoder)[:, : start * 2048]
    assert float((torch.cat(pieces, dim=-1) - whole).abs().max()) <= EXACT


def test_streaming_decode_stops_at_max_frames(oracle_decoder):
    stream = StreamingDecoder(oracle_decoder)
    stream.push(_codes(FRAMES - 4))
    with pytest.raises(ValueError, match=f"max_positions {FRAMES}"):
        stream.push(_codes(5))
    stream.reset()
    assert stream.push(_codes(4)).shape == (1, 4 * 2048)


def test_stream_equals_generate_chunk_by_chunk(endless_tts):
    whole = endless_tts.generate(TEXT, seed=1, max_frames=20)
    speech = endless_tts.stream(TEXT, seed=1, max_frames=20, chunk_frames=8)
    chunks = list(speech)
    assert whole.frames == 20 and speech.frames == whole.frames
    assert speech.first_chunk_frames == DEFAULTS.speech.first_chunk_frames == 1
    assert [len(c) for c in chunks[:-1]] == [1 * 2048, 2 * 2048, 4 * 2048] + [8 * 2048] * (len(chunks) - 4)
    assert all(c.dtype == np.float32 for c in chunks)
    assert float(np.abs(np.concatenate(chunks) - whole.audio).max()) <= EXACT
    assert speech.reached_eos == [whole.reached_eos] and speech.seed == 1
    assert 0 < speech.first_audio_s and speech.pieces[0].text == TEXT


def test_overlapped_codec_gives_the_same_chunks(tiny_tts):
    """Decoding beside the frames changes when chunks are ready, not what or in which order; a split text (pieces,
    pauses) included; closing the stream early stops the codec's work. Overlap is the default exactly when the codec
    runs in a process of its own."""
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(3))
    assert tiny_tts.stream(text).overlap_codec == tiny_tts.backend.codec_process
    plain = list(tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=3, overlap_codec=False))
    overlapped = tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=3, overlap_codec=True)
    assert overlapped.overlap_codec and len(overlapped.pieces) == 3
    chunks = list(overlapped)
    assert [len(c) for c in chunks] == [len(c) for c in plain] and len(chunks) > 6
    assert max(float(np.abs(a - b).max()) for a, b in zip(chunks, plain)) <= EXACT
    early = iter(tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=3, overlap_codec=True))
    next(early), next(early)
    early.close()  # the codec's thread is shut down as the stream's generator closes
    again = list(tiny_tts.stream(text, seed=3, max_frames=12, chunk_frames=3, overlap_codec=False))
    assert max(float(np.abs(a - b).max()) for a, b in zip(again, plain)) <= EXACT  # nothing leaked


@pytest.mark.parametrize(
    "first, chunk, sizes",
    [
        (1, 8, [1, 2, 4, 8, 5]),
        (3, 3, [3] * 6 + [2]),
        (None, 2, [1] + [2] * 9 + [1]),
        (12, 5, [12, 5, 3]),
        (None, 16, [1, 2, 4, 8, 5]),
    ],
)
def test_first_chunk_frames_changes_when_audio_comes_not_what_it_is(endless_tts, first, chunk, sizes):
    """The first chunk holds ``first_chunk_frames`` (None: 1, at most ``chunk_frames``), each next one twice the
    last up to ``chunk_frames``: the samples are the whole utterance's whatever the sizes."""
    whole = endless_tts.generate(TEXT, seed=1, max_frames=20)
    assert whole.frames == 20
    chunks = list(endless_tts.stream(TEXT, seed=1, max_frames=20, chunk_frames=chunk, first_chunk_frames=first))
    assert [len(c) // 2048 for c in chunks] == sizes
    assert float(np.abs(np.concatenate(chunks) - whole.audio).max()) <= EXACT


@pytest.mark.parametrize("overlap", [False, True])
def test_the_timeline_times_each_chunk_made_decoded_and_sent_in_order(tiny_tts, overlap):
    """One entry a chunk (pauses are none), its frames those of the chunk handed on, each chunk made before its
    decode begins, decoded before it is sent, and the chunks decoded and sent in order."""
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(2))
    speech = tiny_tts.stream(text, seed=2, max_frames=7, chunk_frames=4, first_chunk_frames=2, overlap_codec=overlap)
    sizes = [len(c) // 2048 for c in speech if c.any()]
    timeline = speech.timeline
    assert [c.frames for c in timeline] == sizes == [2, 4, 1, 4, 3] and sum(sizes) == speech.frames
    for c in timeline:
        assert c.made_s <= c.decode_start_s <= c.decoded_s <= c.sent_s
    for before, after in zip(timeline, timeline[1:]):
        assert before.made_s <= after.made_s and before.decoded_s <= after.decode_start_s
        assert before.sent_s <= after.sent_s
    assert timeline[0].sent_s == speech.first_audio_s


def test_only_the_streams_first_chunk_is_short(tiny_tts):
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(3))
    speech = tiny_tts.stream(text, seed=2, max_frames=7, chunk_frames=4, first_chunk_frames=2)
    sizes = [len(c) // 2048 if c.any() else "pause" for c in speech]
    assert len(speech.pieces) == 3
    assert sizes == [2, 4, 1, "pause", 4, 3, "pause", 4, 3]


def test_long_text_is_split_and_spoken_in_order_with_pauses(tiny_tts):
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(3))
    speech = tiny_tts.stream(text, seed=2, max_frames=5, chunk_frames=4)
    assert len(speech.pieces) == 3
    assert " ".join(p.text for p in speech.pieces) == text
    chunks = list(speech)
    pause = round(DEFAULTS.speech.pause_s * 44100)
    assert sum(len(c) == pause and not c.any() for c in chunks) == len(speech.pieces) - 1
    assert len(speech.reached_eos) == len(speech.pieces)
    again = np.concatenate(list(tiny_tts.stream(text, seed=2, max_frames=5, chunk_frames=4)))
    assert np.array_equal(np.concatenate(chunks), again)
    assert speech.duration_s == pytest.approx(len(again) / 44100)


def test_a_piece_that_ends_at_once_gets_no_pause(tiny_tts, monkeypatch):
    """The model ends the second of three pieces on its first frame: the stream goes on with the third, one pause
    between the two pieces that have audio (none around the silent one), and says so in ``duration_s``."""
    import dataclasses

    from audio8_coreai.engine import stream as stream_module

    calls, original = [], stream_module.frame_steps

    def second_ends_at_once(backend, utterance, params):
        calls.append(1)
        steps = original(backend, utterance, params)
        if len(calls) == 2:
            yield dataclasses.replace(next(steps), semantic=backend.cfg.eos_token_id)
            return
        yield from steps

    monkeypatch.setattr(stream_module, "frame_steps", second_ends_at_once)
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(3))
    speech = tiny_tts.stream(text, seed=2, max_frames=5, chunk_frames=4)
    chunks = list(speech)
    pause = round(DEFAULTS.speech.pause_s * 44100)
    assert len(speech.pieces) == 3 and speech.reached_eos[1] and speech.frames == 10
    assert [len(c) == pause and not c.any() for c in chunks].count(True) == 1
    assert speech.duration_s == pytest.approx(sum(len(c) for c in chunks) / 44100)


def test_closing_a_stream_early_leaks_nothing_into_the_next_utterance(tiny_tts):
    fresh = tiny_tts.generate("A second, different sentence.", seed=3, max_frames=12)
    speech = iter(tiny_tts.stream(TEXT, seed=4, max_frames=60, chunk_frames=4))
    next(speech)
    speech.close()
    assert np.array_equal(tiny_tts.generate("A second, different sentence.", seed=3, max_frames=12).audio, fresh.audio)


def test_on_frame_can_stop_a_stream(tiny_tts):
    class Stop(Exception):
        pass

    def stop_at_5(step):
        if step == 5:
            raise Stop

    speech = tiny_tts.stream(TEXT, seed=1, max_frames=20, chunk_frames=4, on_frame=stop_at_5)
    with pytest.raises(Stop):
        list(speech)
    assert speech.frames == 5


@pytest.mark.parametrize("kwargs", [{"chunk_frames": 0}, {"first_chunk_frames": 0}, {"seed": -1}, {"temperature": 0.0}])
def test_stream_checks_before_the_first_frame(tiny_tts, kwargs):
    with pytest.raises(ValueError):
        tiny_tts.stream(TEXT, **kwargs)


def test_unsplittable_long_run_is_a_clear_error(tiny_tts):
    with pytest.raises(PromptError, match=r"'a{39}…' \(400 characters, at character 0\) is 400 tokens with nowhere"):
        tiny_tts.stream("a" * 400, seed=0)
    with pytest.raises(PromptError, match=r"\(200 characters, at character 4\) is 600 tokens .*no space, and no"):
        tiny_tts.stream("Hi. " + "我" * 200, seed=0)  # a CJK run: 3 tokens a character here (bytes)


# ------------------------------------------------------------------------------------------------------------
# The splitter (characters as tokens, so the limits are easy to read)


@pytest.mark.parametrize(
    "text, limit, pieces",
    [
        ("Short enough.", 20, ["Short enough."]),
        ("One two. Three four! Five six? Seven.", 20, ["One two. Three four!", "Five six? Seven."]),
        ("Pi is 3.14 today. It rained, then it stopped.", 20, ["Pi is 3.14 today.", "It rained,", "then it stopped."]),
        (
            "你好，世界。今天天气很好！我们去公园吧？好的。",
            8,
            ["你好，世界。", "今天天气很好！", "我们去公园吧？", "好的。"],
        ),
        ("一二三四五六七八九十，一二三四五。", 12, ["一二三四五六七八九十，", "一二三四五。"]),
        ('He said "stop." Then he left, quietly.', 16, ['He said "stop."', "Then he left,", "quietly."]),
        ("words without any punctuation at all here", 12, ["words", "without any", "punctuation", "at all here"]),
        ("... Hello there.", 12, ["... Hello", "there."]),
    ],
)
def test_split_text(text, limit, pieces):
    out = split_text(text, limit, len)
    assert out == pieces
    assert all(len(p) <= limit for p in out if any(c.isalnum() for c in p))


def test_split_text_refuses_a_run_it_cannot_split():
    with pytest.raises(PromptError, match=r"'aaaaaaaaaa' \(10 characters, at character 4\) is 10 tokens"):
        split_text("ok. aaaaaaaaaa", 8, len)
    with pytest.raises(PromptError, match="empty"):
        split_text("   ", 8, len)


# ------------------------------------------------------------------------------------------------------------
# CLI


def test_say_stream_writes_the_streamed_audio(tiny_checkpoint, tiny_tts, tmp_path):
    out = tmp_path / "streamed.wav"
    result = CliRunner().invoke(
        app,
        [
            "say",
            TEXT,
            "-o",
            str(out),
            "--model",
            str(tiny_checkpoint),
            "--seed",
            "1",
            "--max-frames",
            "20",
            "--device",
            "cpu",
            "--stream",
            "--chunk-frames",
            "8",
            "--first-chunk-frames",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "first audio after" in result.output and "in 1 piece," in result.output
    data, rate = sf.read(out, dtype="float32")
    expected = tiny_tts.generate(TEXT, seed=1, max_frames=20).audio
    assert rate == 44100 and data.shape == expected.shape
    assert float(np.abs(data - expected).max()) <= EXACT  # the file stores floats: only the codec's rounding
