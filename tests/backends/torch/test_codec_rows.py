"""The codec batched across streams (backends/torch/codec_rows.py): pushes of streams at different points stacked
into one codec call give each stream's own incremental decode; the batched server's rows use it."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from audio8_coreai import TTS
from audio8_coreai.backends.torch.codec_rows import CodecRows, CodecRowsStream, Push
from audio8_coreai.config import CodecConfig
from audio8_coreai.model.codec import CodecDecoder, StreamingDecoder

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the device check runs it)")

EXACT = 1e-5  # streamed samples equal the incremental decode's at fp32 (tests/engine/test_streaming.py)
FRAMES = 48


@pytest.fixture(scope="module")
def deep_decoder(oracle_dir: Path) -> CodecDecoder:
    """The oracle codec with a 3-layer, window-8 post transformer (each layer the oracle's one): utterances span
    many windows, and stacked layers see past one (as the 0.6b codec's)."""
    cfg = CodecConfig.from_spec(json.loads((oracle_dir / "codec_spec.json").read_text()))
    sd = torch.load(oracle_dir / "codec.pth", weights_only=True, map_location="cpu")
    oracle = CodecDecoder.from_state_dict(cfg, sd, max_frames=FRAMES)
    qt = dataclasses.replace(cfg.quantizer_transformer, n_layer=3, window_size=8)
    deep = CodecDecoder(dataclasses.replace(cfg, quantizer_transformer=qt), max_frames=FRAMES)
    src = oracle.state_dict()
    deep.load_state_dict({k: src[re.sub(r"(post_module\.layers\.)\d+", r"\g<1>0", k)] for k in deep.state_dict()})
    return deep.eval().requires_grad_(False)


@pytest.fixture
def rows(deep_decoder):
    codec = CodecRows(deep_decoder, gather_s=1.0)
    yield codec
    codec.close()


def _codes(rows: int, frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 128, (rows, 10, frames))


def _alone(decoder: CodecDecoder, codes: np.ndarray) -> np.ndarray:
    """Each row's own incremental decode (the dynamic form, on the decoder's device), pushes of 5 frames."""
    stream, dev = StreamingDecoder(decoder), next(decoder.parameters()).device
    with torch.no_grad():
        parts = [stream.push(torch.as_tensor(codes[..., s : s + 5], device=dev)) for s in range(0, codes.shape[-1], 5)]
    return torch.cat(parts, -1).cpu().numpy()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_stacked_pushes_equal_each_streams_own_decode(deep_decoder, device):
    """Streams joining at different frames (one of two utterances in lock-step) stacked in one call per step
    (on CUDA on the codec's own stream): each gets its own decode's samples, past the window."""
    deep_decoder = copy.deepcopy(deep_decoder).to(device)
    rows = CodecRows(deep_decoder)
    a, b, c = rows.stream(), rows.stream(), rows.stream()
    codes = {a: _codes(1, 30, 1), b: _codes(2, 30, 2), c: _codes(1, 30, 3)}
    got: dict[CodecRowsStream, list[np.ndarray]] = {s: [] for s in codes}
    for plan in [{a: (0, 4)}, {a: (4, 8), b: (0, 4)}, {a: (8, 24), b: (4, 20), c: (0, 16)}, {b: (20, 21), c: (16, 17)}]:
        pushes = [Push(s, codes[s][..., lo:hi]) for s, (lo, hi) in plan.items()]
        for p, wav in zip(pushes, rows.run(pushes)):
            assert wav.shape == (len(p.codes), p.codes.shape[-1] * 2048)
            got[p.stream].append(wav)
    assert rows.calls == 4 and rows.pushes == 8
    for s, parts in got.items():
        want = _alone(deep_decoder, codes[s][..., : s.frames])
        assert s.frames == {a: 24, b: 21, c: 17}[s]
        assert float(np.abs(np.concatenate(parts, -1) - want).max()) <= EXACT
    rows.close()


def test_streams_on_threads_share_codec_calls(rows, deep_decoder):
    """Four streams pushing from their own threads, chunks 1, 2, 4, 8 then 16: each gets its own decode's samples,
    and the codec thread stacked their pushes (fewer calls than pushes)."""
    sizes, n = [1, 2, 4, 8, 16], 4
    codes = [_codes(1, sum(sizes), 10 + i) for i in range(n)]
    out: list[np.ndarray | None] = [None] * n
    barrier = threading.Barrier(n)

    def speak(i: int) -> None:
        stream, parts, start = rows.stream(), [], 0
        for size in sizes:
            barrier.wait()  # the streams' chunks come due together, as rows of one frame loop do
            parts.append(stream.push(codes[i][0, :, start : start + size]))
            start += size
        out[i] = np.concatenate(parts)

    threads = [threading.Thread(target=speak, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rows.pushes == n * len(sizes) and rows.calls < rows.pushes
    for i in range(n):
        assert float(np.abs(out[i] - _alone(deep_decoder, codes[i])[0]).max()) <= EXACT


def test_bounds_and_close(rows):
    stream = rows.stream()
    stream.push(_codes(1, FRAMES - 4, 0)[0])
    with pytest.raises(ValueError, match=f"max_positions {FRAMES}"):
        stream.push(_codes(1, 5, 0)[0])
    rows.close()
    with pytest.raises(RuntimeError, match="closed"):
        rows.stream().push(_codes(1, 1, 0)[0])
    short = dataclasses.replace(rows.decoder.cfg)
    with pytest.raises(ValueError, match="at least 23 frames, not 20"):
        CodecRows(CodecDecoder(short, max_frames=20))


def test_batched_server_rows_decode_through_one_codec_thread(tiny_checkpoint, tmp_path):
    """A frame server with the batched codec (the CUDA default, asked for here on the CPU): streamed speech through
    a row, and a whole utterance's decode (generate: it decoded alone, outside the batched codec), equal the same
    seed's speech from the model alone."""
    from audio8_coreai.backends.torch.rows import FrameServer
    from tests.steered import steer_eos

    endless = steer_eos(tiny_checkpoint, tmp_path / "never_eos", "never")  # the tiny context, 512: the codec's too
    tts = TTS.load(endless, device="cpu", precision="fp32", codec_process=False)

    server = FrameServer(tts.backend, 2, batch_codec=True)
    try:
        row = TTS(tts.checkpoint, server.rows()[0], tts.prompts, tts.voices)
        assert isinstance(row.backend.codec_stream(), CodecRowsStream)
        got = np.concatenate(list(row.stream("Hello there.", seed=4, max_frames=12, chunk_frames=4)))
        want = np.concatenate(list(tts.stream("Hello there.", seed=4, max_frames=12, chunk_frames=4)))
        assert got.shape == want.shape == (12 * 2048,)
        np.testing.assert_allclose(got, want, rtol=0, atol=EXACT)
        assert server.codec.pushes >= 3
        pushes = server.codec.pushes
        got = row.generate("Hello there.", seed=4, max_frames=20).audio
        want = tts.generate("Hello there.", seed=4, max_frames=20).audio
        assert got.shape == want.shape == (20 * 2048,)
        np.testing.assert_allclose(got, want, rtol=0, atol=EXACT)
        assert server.codec.pushes == pushes + 2  # 16 frames, then 4
    finally:
        server.close()
