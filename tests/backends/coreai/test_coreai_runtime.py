"""The Core AI backend at run time: backends, state, the codec stream, the TTS API and the CLI (bad input:
test_coreai_refusals.py).

The assets (converted from the tiny oracle checkpoint, run by the coreai.runtime CPU interpreter) and how they
are made: coreai_support.py; the fixtures: conftest.py.
"""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.backends.coreai.coreai_support import TEXT, _params, _said, coreai_missing

pytest.importorskip("coreai.runtime", reason=coreai_missing())

from audio8_coreai import TTS
from audio8_coreai.backends.coreai import CoreAIBackend, read_manifest
from audio8_coreai.engine.loop import generate
from audio8_coreai.errors import BackendError, PrecisionError
from audio8_coreai.measure.oracle import load_fixture
from audio8_coreai.measure.parity import replay_forced, replay_single
from audio8_coreai.settings import DEFAULTS
from tests.cli.cli_support import run as _run

# ---------------------------------------------------------------------------------------------------
# Backends, state, codec


def test_torch_and_coreai_agree_on_the_same_seed(fp32_backend, torch_backend, oracle, fixture):
    prompt = fixture["plain__prompt_input_ids"][0]
    for seed in (3, 4):
        a = generate(torch_backend, prompt, _params(oracle), seed=seed, max_frames=24)
        b = generate(fp32_backend, prompt, _params(oracle), seed=seed, max_frames=24)
        assert np.array_equal(a.codes, b.codes) and a.reached_eos == b.reached_eos
    wave_torch, wave_coreai = torch_backend.decode_window(a.codes), fp32_backend.decode_window(b.codes)
    assert wave_coreai.shape == wave_torch.shape and np.abs(wave_coreai - wave_torch).max() < 1e-4


def test_back_to_back_recordings_replay_exactly(fp32_backend, oracle_dir):
    """The plain recording (24 prompt columns + 18 steps) replays exactly, teacher-forced and free-running on its
    recorded noise, right after the clone recording (57 + 24 steps) left state up to position 81 past it; the
    parity run (test_fp32_assets_reproduce_the_oracle) covers the other order."""
    fx, meta = load_fixture(oracle_dir / "fixture.npz")
    clone = replay_forced(fp32_backend, fx, meta, "clone")
    assert clone.steps == 24 and clone.semantic_draws == (24, 24) and not clone.misses
    plain = replay_single(fp32_backend, fx, meta, "plain")
    assert plain.steps == 18 and plain.slow_logits_max_diff < 1e-4 and plain.fast_logits_max_diff < 1e-4
    assert plain.semantic_draws == (18, 18) and plain.codebook_draws == (9 * 18, 9 * 18) and not plain.misses
    assert plain.free_run_identical and plain.free_run_eos


def test_calls_from_inside_a_running_event_loop(fp32_backend, oracle, fp32_assets, fixture):
    """An async caller (a web handler, a notebook) can use the backend directly: its runtime calls run on a
    loop of its own thread, so a running loop in the caller's thread is no obstacle."""
    prompt = fixture["plain__prompt_input_ids"][0]
    want = generate(fp32_backend, prompt, _params(oracle), seed=8, max_frames=10).codes

    async def speak() -> tuple[np.ndarray, np.ndarray]:
        fresh = CoreAIBackend(oracle, fp32_assets)  # loaded inside the running loop too
        try:
            return (
                generate(fp32_backend, prompt, _params(oracle), seed=8, max_frames=10).codes,
                generate(fresh, prompt, _params(oracle), seed=8, max_frames=10).codes,
            )
        finally:
            fresh.close()

    got, fresh_codes = asyncio.run(speak())
    assert want.shape[1] > 0 and np.array_equal(got, want) and np.array_equal(fresh_codes, want)


LONG = 320  # frames of the long stream (20 pushes): the codec transformer's 128-frame window passed twice over
PUSH_INPUTS = {"codes": (1, 10, 16), "start": (1,), "count": (1,)}  # a decoder call's input shapes: main
FIRST_INPUTS = {**PUSH_INPUTS, "codes": (1, 10, 1)}  # and first (a push of 1 frame)


@pytest.fixture
def decoder_calls(fp32_backend, monkeypatch) -> list[dict[str, tuple[int, ...]]]:
    """The input shapes of every runtime call ``fp32_backend`` makes during the test, in order."""
    shapes: list[dict[str, tuple[int, ...]]] = []
    call = fp32_backend._call

    def recorded(fn, inputs, state=None):
        shapes.append({k: v.shape for k, v in inputs.items()})
        return call(fn, inputs, state)

    monkeypatch.setattr(fp32_backend, "_call", recorded)
    return shapes


def test_codec_stream_decodes_every_frame_once_exactly(fp32_backend, torch_backend, decoder_calls):
    """The stateful decoder asset streams a 320-frame utterance in 16-frame pushes: each push is one runtime
    call of the same shapes (a late push costs what an early one does), and its audio equals the torch
    incremental decoder's and the whole-utterance decode's for those frames within 1e-4."""
    codes = np.random.default_rng(0).integers(0, 256, size=(10, LONG))
    with torch.no_grad():
        whole = torch_backend.decoder(torch.as_tensor(codes)[None])[0].numpy()
    stream, torch_stream = fp32_backend.codec_stream(), torch_backend.codec_stream()
    for first in range(0, LONG, 16):
        got = stream.push(codes[:, first : first + 16])
        assert len(decoder_calls) == first // 16 + 1 and got.shape == (16 * 2048,)
        assert np.abs(got - torch_stream.push(codes[:, first : first + 16])).max() < 1e-4
        assert np.abs(got - whole[first * 2048 : (first + 16) * 2048]).max() < 1e-4
    assert decoder_calls == [PUSH_INPUTS] * (LONG // 16)
    assert (stream.frames, stream.decoded) == (LONG, LONG)  # every frame decoded once: 1.0 per frame of audio


def test_codec_stream_pads_short_pushes_and_splits_long_ones(fp32_backend, torch_backend, decoder_calls):
    """A push of 1 frame (a stream's first chunk) is one call of the asset's 1-frame function ``first``; pushes of
    2, 4, 8 frames and a last partial one are padded inside the fixed 16-frame shape (one call each), a 20-frame
    push is two calls; the two functions carry one state, and each push's audio is exact (1e-4). An utterance
    past the asset's 512 frames is refused; nothing to decode is no call."""
    codes = np.random.default_rng(1).integers(0, 256, size=(10, 40))
    with torch.no_grad():
        whole = torch_backend.decoder(torch.as_tensor(codes)[None])[0].numpy()
    stream, torch_stream = fp32_backend.codec_stream(), torch_backend.codec_stream()
    first = 0
    for n, runtime_calls in ((1, 1), (1, 1), (2, 1), (4, 1), (8, 1), (20, 2), (3, 1), (1, 1)):
        calls = len(decoder_calls)
        got = stream.push(codes[:, first : first + n])
        assert len(decoder_calls) - calls == runtime_calls and got.shape == (n * 2048,)
        assert np.abs(got - torch_stream.push(codes[:, first : first + n])).max() < 1e-4
        assert np.abs(got - whole[first * 2048 : (first + n) * 2048]).max() < 1e-4
        first += n
    assert decoder_calls == [FIRST_INPUTS] * 2 + [PUSH_INPUTS] * 6 + [FIRST_INPUTS]
    assert (stream.frames, stream.decoded) == (40, 1 + 1 + 16 * 6 + 1)  # the padding of 2-, 4-, 8-, 3-frame pushes
    with pytest.raises(BackendError, match="up to 512 frames per utterance"):
        fp32_backend.codec_stream().push(np.zeros((10, 513), np.int64))
    assert fp32_backend.decode_window(np.zeros((10, 0), np.int64)).shape == (0,) and len(decoder_calls) == 9


def test_transposed_convolutions_on_the_cpu_runtime(tmp_path):
    """ConvTranspose1d at the codec decoder's (kernel 16, stride 8) and its other strides is numerically wrong
    on Apple's cpu_only delegate (PORT-NOTES section 7); on this runtime it must equal torch."""
    import coreai.runtime as rt
    import coreai_torch
    from coreai.authoring import AIModelAsset

    from audio8_coreai.backends.coreai.export import export_program

    torch.manual_seed(0)
    layers = {f"k{2 * s}s{s}": torch.nn.ConvTranspose1d(48, 24, 2 * s, stride=s).eval() for s in (8, 4, 2)}
    x = torch.randn(1, 48, 40)
    converter = coreai_torch.TorchConverter()
    for name, layer in layers.items():
        converter.add_exported_program(
            export_program(layer, (x,)), input_names=["x"], output_names=["y"], entrypoint_name=name
        )
    asset = converter.to_coreai().save_asset(tmp_path / "convt.aimodel")

    async def run() -> dict[str, np.ndarray]:
        async with AIModelAsset.load(asset.path).executable() as model:
            return {
                name: (await model.load_function(name)(inputs={"x": rt.NDArray(x.numpy())}))["y"].numpy().copy()
                for name in layers
            }

    got = asyncio.run(run())
    for name, layer in layers.items():
        with torch.no_grad():
            want = layer(x).numpy()
        assert got[name].shape == want.shape
        assert np.abs(got[name] - want).max() < 1e-5, name


# ---------------------------------------------------------------------------------------------------
# API and command line


def test_tts_api_on_the_coreai_backend_matches_torch(speakable, fp32_assets):
    coreai_tts = TTS.load(speakable, backend="coreai", assets=fp32_assets)
    torch_tts = TTS.load(speakable, device="cpu")
    a = coreai_tts.generate(TEXT, seed=5, max_frames=20)
    b = torch_tts.generate(TEXT, seed=5, max_frames=20)
    assert np.array_equal(a.codes, b.codes) and a.frames > 0
    assert np.abs(a.audio - b.audio).max() < 1e-4
    with pytest.raises(BackendError, match="give assets=DIR"):
        TTS.load(speakable, backend="coreai")
    with pytest.raises(BackendError, match="these assets were converted at fp32, not fp16: drop --precision fp16"):
        TTS.load(speakable, backend="coreai", assets=fp32_assets, precision="fp16")  # was run at fp32, unsaid
    with pytest.raises(PrecisionError, match="precision int8 does not run on coreai: use one of fp32, fp16, int8-fp16"):
        TTS.load(speakable, backend="coreai", assets=fp32_assets, precision="int8")  # said convert --precision int8
    assert TTS.load(speakable, backend="coreai", assets=fp32_assets, precision="fp32").backend.precision == "fp32"


def test_cli_say_with_coreai(speakable, fp32_assets, tmp_path):
    out = tmp_path / "speech.wav"
    result = _run(
        "say",
        TEXT,
        "-o",
        out,
        "--model",
        speakable,
        "--seed",
        5,
        "--max-frames",
        20,
        "--backend",
        "coreai",
        "--assets",
        fp32_assets,
    )
    assert result.exit_code == 0, result.output

    said = _said(result)
    frames = int(re.search(r"(\d+)\s+frames", said).group(1))
    pieces = re.search(r"in (\d+) piece", said)  # the assets' short context may split TEXT into sentences
    pauses = (int(pieces.group(1)) - 1) * round(DEFAULTS.speech.pause_s * 44100) if pieces else 0
    assert sf.read(out)[0].shape == (frames * 2048 + pauses,) and "coreai fp32" in said
    result = _run("say", TEXT, "-o", out, "--model", speakable, "--backend", "coreai", "--assets", tmp_path / "no")
    assert result.exit_code == 2 and "no Core AI asset folder" in _said(result)


def test_a_context_too_short_to_speak_is_said(tiny_checkpoint, tmp_path):
    """A context that holds a parity fixture's prompt but no sentence and its speech converts, and is said to (of
    the dualar only: the codec parts take no context)."""
    args = ("--part", "dualar", "--precision", "fp16")
    result = _run("convert", "--model", tiny_checkpoint, "--out", tmp_path / "short", "--context", 64, *args)
    assert result.exit_code == 0, result.output
    assert re.search(r"note: --context 64 holds no text and its speech .* give --context \d+ or more", _said(result))
    result = _run("convert", "--model", tiny_checkpoint, "--out", tmp_path / "long", "--context", 512, *args)
    assert result.exit_code == 0 and "note:" not in _said(result), result.output
    decoder = ("--part", "codec_decoder", "--decoder-frames", 4, "--precision", "fp16", "--context", 64)
    result = _run("convert", "--model", tiny_checkpoint, "--out", tmp_path / "decoder", *decoder)
    assert result.exit_code == 0 and "note:" not in _said(result), result.output


def test_cli_convert_one_part(oracle_dir, tmp_path):
    result = _run(
        "convert",
        "--model",
        oracle_dir,
        "--out",
        tmp_path / "dec",
        "--precision",
        "fp16",
        "--decoder-frames",
        4,
        "--part",
        "codec_decoder",
    )
    assert result.exit_code == 0, result.output
    assert "codec_decoder.aimodel" in _said(result)
    assert [p.name for p in (tmp_path / "dec").iterdir()] == ["codec_decoder.aimodel"]
    decoder = read_manifest(tmp_path / "dec" / "codec_decoder.aimodel")
    assert decoder["precision"] == "fp16" and decoder["pushes"] == {"main": 4} and list(decoder["contract"]) == ["main"]
    result = _run("convert", "--model", oracle_dir, "--out", tmp_path / "dec")
    said = "dec already holds codec_decoder.aimodel: remove it to convert it again, or choose a new folder; or "
    assert result.exit_code == 2 and said + "convert only what it lacks: --part dualar --part codec_encoder" in _said(
        result
    )
    args = ("--precision", "fp16", "--encoder-frames", 8, "--part", "codec_encoder")
    result = _run("convert", "--model", oracle_dir, "--out", tmp_path / "dec", *args)  # completes the folder
    assert result.exit_code == 0 and "MB (beside codec_decoder.aimodel)" in _said(result), result.output
    assert sorted(p.name for p in (tmp_path / "dec").iterdir()) == ["codec_decoder.aimodel", "codec_encoder.aimodel"]


@pytest.mark.parametrize(
    "audio, said",
    [
        (np.zeros((44100, 2), np.float32), r"clip audio must be mono \[samples\], not shape \[44100, 2\]"),
        (
            (np.ones(44100) * 1000).astype(np.int16),
            r"clip audio is int16 samples: give float samples in \[-1, 1\] \(int16 samples: divide them by 32768",
        ),
        (np.zeros(0, np.float32), "clip audio holds no samples"),
    ],
)
def test_a_clip_that_is_no_mono_float_audio_is_refused_by_both_encoders(fp32_backend, torch_backend, audio, said):
    """Stereo was flattened into one interleaved clip twice as long, integers taken unscaled: codes of noise."""
    from audio8_coreai.errors import AudioError

    for backend in (fp32_backend, torch_backend):
        with pytest.raises(AudioError, match=said):
            backend.encode(audio)


def test_a_clip_past_the_encoders_bucket_names_the_option_that_holds_it(fp32_backend):
    bucket = read_manifest(fp32_backend.folder / "codec_encoder.aimodel")["frames"]
    with pytest.raises(BackendError, match=rf"up to .* s \({bucket} frames\); .*--encoder-frames {bucket + 1} or more"):
        fp32_backend.encode(np.zeros(bucket * 2048 + 1, np.float32))


def test_a_conversion_ended_by_sigterm_leaves_nothing_behind(oracle_dir, tmp_path):
    """``timeout``, ``docker stop`` or a CI cancel send SIGTERM: the command unwinds as after a Ctrl-C (its hidden
    ``.OUT.partial-*`` folder removed, no OUT), says "terminated" and ends by the signal, as before (systemd's
    clean stop). It left the folder for ever."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    command = [sys.executable, "-m", "audio8_coreai.cli", "convert", "--model", str(oracle_dir), "--out", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not list(tmp_path.glob(".out.partial-*")):  # converting
            assert proc.poll() is None and time.monotonic() - t0 < 120, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, said = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM and said.strip().endswith("terminated"), said[-2000:]
    assert "Traceback" not in said and list(tmp_path.iterdir()) == []
