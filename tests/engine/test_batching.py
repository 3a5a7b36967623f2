"""Batching (batching.py): utterances sharing frame calls give what each gives alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from audio8_coreai import TTS
from audio8_coreai.engine.batch import BatchEngine, generate_batch
from audio8_coreai.engine.loop import generate
from audio8_coreai.errors import BackendError, EngineError
from audio8_coreai.model.frame import Frame
from audio8_coreai.request import check_request

TEXTS = (
    "Hello there.",
    "A much longer sentence, with more words in it, for a longer prompt.",
    "Short",
    "The fourth one.",
)


@pytest.fixture(scope="module")
def tts_fp32(tiny_checkpoint):
    return TTS.load(tiny_checkpoint, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def tts_int16(tiny_checkpoint):
    return TTS.load(tiny_checkpoint, device="cpu", precision="int16")


@pytest.mark.parametrize("gather", [False, True], ids=["per-row", "gathered"])
def test_slow_step_rows_equals_batch_one_steps(tts_fp32, gather):
    """Utterances at different positions (3 prompts of different lengths) in rows 2, 0 and 3 of a 4-row state
    step as each would alone, with attention per row (CPU) or gathered under a key mask (GPU)."""
    backend, cfg = tts_fp32.backend, tts_fp32.config
    model = backend.model
    prompts = [tts_fp32.prompts.plain(t) for t in TEXTS[:3]]
    k, v = model.new_kv_cache(batch=4)
    rows = [2, 0, 3]
    columns, alone, written = [], [], []
    rng = np.random.default_rng(0)
    for row, prompt in zip(rows, prompts):
        backend.prefill(prompt)
        n = prompt.shape[1]
        k[:, row, :, :n], v[:, row, :, :n] = backend.k_cache[:, 0, :, :n], backend.v_cache[:, 0, :, :n]
        col = np.concatenate([[cfg.semantic_begin_id + 7], rng.integers(0, cfg.codebook_size, cfg.num_codebooks)])
        columns.append(col)
        with torch.inference_mode():
            alone.append(
                Frame(model).slow_step(torch.as_tensor(col).view(1, -1, 1), n, backend.k_cache, backend.v_cache)
            )
        written.append(backend.k_cache[:, 0, :, n].clone())
    pos = [p.shape[1] for p in prompts]
    assert len(set(pos)) == 3
    with torch.inference_mode():  # gather: the GPU's way, checked here on the CPU
        logits, hidden = Frame(model).slow_rows(
            torch.as_tensor(np.stack(columns)).view(3, -1, 1), rows, pos, k, v, gather=gather
        )
    for j, (row, (lg, hd)) in enumerate(zip(rows, alone)):
        assert torch.allclose(logits[j], lg[0], atol=1e-5, rtol=0)
        assert torch.allclose(hidden[j], hd[0], atol=1e-5, rtol=0)
        assert torch.allclose(k[:, row, :, pos[j]], written[j], atol=1e-5, rtol=0)  # its own slot
        assert not k[:, row, :, pos[j] + 1 :].any()  # and nothing past it
    assert not k[:, 1].any()  # the row no utterance holds


def test_generate_batch_equals_generate_fp32(tts_fp32):
    """Four prompts, two rows: rows free at different steps and later prompts take them (frame 0 drawn in the
    same call as the other row's frame); every utterance's codes equal its batch-1 run with the same seed."""
    prompts = [tts_fp32.prompts.plain(t) for t in TEXTS]
    params = tts_fp32.sampling()
    seeds, caps = [3, 5, 7, 11], [12, 40, 30, 25]
    batched = generate_batch(tts_fp32.backend, prompts, params, seeds, caps, max_batch=2)
    for prompt, seed, cap, got in zip(prompts, seeds, caps, batched):
        alone = generate(tts_fp32.backend, prompt, params, seed, cap)
        assert got.codes.shape == alone.codes.shape
        np.testing.assert_array_equal(got.codes, alone.codes)
        assert got.reached_eos == alone.reached_eos
        assert got.frames == (alone.frames if alone.reached_eos else cap)


def test_batched_int16_logits_within_bound(tts_int16):
    """int16: ONNX Runtime's MatMulNBits rounds a batched [n, k] product differently from n single rows, so
    batched logits are close to (not equal to) batch-1 ones: measured 6.5e-4 on the tiny checkpoint."""
    backend, params = tts_int16.backend, tts_int16.sampling()
    prompts = [tts_int16.prompts.plain(t) for t in TEXTS[:2]]
    engine = BatchEngine(backend, params, 2)
    runs = {}
    for i, prompt in enumerate(prompts):
        runs[id(engine.admit(prompt, 10, seed=i, logits=True))] = (i, [])
    while engine.items:
        for item, res in engine.step():
            runs[id(item)][1].append(res)
    for i, results in runs.values():
        alone = generate(backend, prompts[i], params, i, 10, keep_results=True).frame_results
        n = min(len(results), len(alone))
        assert n >= 2
        for a, b in zip(results[:n], alone[:n]):
            assert np.abs(a.logits - b.logits).max() < 2e-3
            assert np.abs(a.fast_logits - b.fast_logits).max() < 2e-3


def test_admit_errors_and_rows(tts_fp32):
    backend, params = tts_fp32.backend, tts_fp32.sampling()
    prompt = tts_fp32.prompts.plain("Hi")
    engine = BatchEngine(backend, params, 2)
    first = engine.admit(prompt, 1, seed=0)  # a cap of 1: done at frame 0, its row freed
    second = engine.admit(prompt, 5, seed=0)
    assert (first.row, second.row, engine.free) == (0, 1, 0)
    with pytest.raises(EngineError, match="busy"):
        engine.admit(prompt, 5, seed=1)
    (item, res), _ = engine.step()
    assert item is first and item.done and item.utterance.steps == 1  # a frame or eos: either ends it at its cap
    assert engine.free == 1 and engine.items == [second]
    third = engine.admit(prompt, 5, seed=2)
    assert third.row == 0  # the freed row
    with pytest.raises(EngineError, match="context"):
        BatchEngine(backend, params, 1).admit(prompt, tts_fp32.config.max_seq_len, seed=0)
    with pytest.raises(ValueError, match="max_batch"):
        BatchEngine(backend, params, 0)
    with pytest.raises(ValueError, match="one each"):
        generate_batch(backend, [prompt], params, [0, 1], [5], max_batch=2)


def test_tts_generate_batch_equals_generate(tts_fp32):
    """The API: codes as generate's, audio from one batched codec call equal to each utterance's own decode."""
    texts, seeds = list(TEXTS[:3]), [1, 2, 3]
    got = tts_fp32.generate_batch(texts, seeds=seeds, max_frames=20, max_batch=2)
    assert [s.seed for s in got] == seeds
    for text, seed, syn in zip(texts, seeds, got):
        alone = tts_fp32.generate(text, seed=seed, max_frames=20)
        np.testing.assert_array_equal(syn.codes, alone.codes)
        assert syn.audio.shape == (alone.frames * 2048,) and syn.sample_rate == 44100
        assert np.abs(syn.audio - alone.audio).max() < 1e-5


def test_tts_generate_batch_bad_input(tts_fp32):
    from audio8_coreai.errors import ConfigError, EngineError, PromptError

    with pytest.raises(ConfigError, match="one seed per text") as e:  # an Audio8Error, as every refusal
        tts_fp32.generate_batch(["a", "b"], seeds=[1])
    assert e.value.field == "seeds"
    with pytest.raises(PromptError, match=r"^texts\[1\]: text is empty"):  # which text, said first
        tts_fp32.generate_batch(["fine", "   "], seeds=[1, 2])
    with pytest.raises(ConfigError, match=r"^seeds\[2\]: seed must be >= 0, got -5$"):
        tts_fp32.generate_batch(["a", "b", "c"], seeds=[1, 2, -5])
    room = tts_fp32.checkpoint.config.max_seq_len - tts_fp32.prompts.plain("a").shape[1]
    with pytest.raises(EngineError, match=r"^texts\[1\]: the prompt is \d+ tokens, so at most"):
        tts_fp32.generate_batch(["a", "a " * 20], max_frames=room)  # fits the first text's room, not the second's
    with pytest.raises(ConfigError, match="^max_frames must be >= 1"):  # the whole batch's setting: no index
        tts_fp32.generate_batch(["fine"], max_frames=0)
    with pytest.raises(ConfigError, match="max_batch must be a whole number"):
        tts_fp32.generate_batch(["fine"], max_batch=1.5)
    with pytest.raises(ConfigError, match="not one string"):
        tts_fp32.generate_batch("hello")
    with pytest.raises(ConfigError, match="a list of strings, got set"):
        tts_fp32.generate_batch({"a", "b"})
    with pytest.raises(ConfigError, match="a list of strings, got generator"):
        tts_fp32.generate_batch(t for t in ("a", "b"))
    plan = tts_fp32.plan(check_request("Hi.", seed=1, temperature=0.3))
    with pytest.raises(
        ConfigError, match=r"^texts\[1\] is a plan and texts\[0\] is not: give all plans or all strings$"
    ):
        tts_fp32.generate_batch(["Hi.", plan])  # the plan's settings and the keywords' would differ unsaid
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus': a request takes voice, ref_audio"):
        tts_fp32.generate("Hi.", bogus=1)  # said as generate's own, not check_request's


def test_frame_server_rows_from_threads_equal_generate(tts_fp32):
    """Three request threads, each streaming its own text (split into pieces on the tiny context) through a
    row of one FrameServer, the codec on the request threads, get the stream each gets alone; the frame
    thread really batched."""
    from concurrent.futures import ThreadPoolExecutor

    server, instances = tts_fp32.batched(3)
    try:
        jobs = [(instances[i], TEXTS[i], seed) for i, seed in enumerate((20, 21, 23))]  # 16, 6 and 4 frames
        with ThreadPoolExecutor(3) as pool:
            streamed = list(
                pool.map(
                    lambda j: np.concatenate(list(j[0].stream(j[1], seed=j[2], max_frames=16, chunk_frames=4))), jobs
                )
            )
        for (_, text, seed), audio in zip(jobs, streamed):
            alone = np.concatenate(list(tts_fp32.stream(text, seed=seed, max_frames=16, chunk_frames=4)))
            assert audio.shape == alone.shape
            assert np.abs(audio - alone).max() < 1e-5
        assert server.frames >= 3 * 2 and server.frames > server.frame_calls  # some calls held several rows
        assert "batched x3" in instances[0].backend.description
        row = "this model is one row of a batched model \\(TTS.batched\\): it speaks one utterance at a time"
        with pytest.raises(BackendError, match=row):  # said "runs on the torch backend, not torch"
            instances[0].generate_batch(["Hi."])
        with pytest.raises(BackendError, match=row):
            instances[0].batched(2)
    finally:
        server.close()
    with pytest.raises(BackendError, match="frame server was closed: call batched\\(\\) again"):  # a RuntimeError
        instances[0].generate("Hi", seed=0, max_frames=2)


def test_batch_rows_bounded_by_texts_and_memory(tts_fp32):
    """A max_batch far over the texts allocates one row per text (the same codes as a fitting max_batch); a batch
    whose KV state is over the machine's memory is refused before it is allocated, naming max_batch."""
    from audio8_coreai.backends.torch.memory import device_memory_bytes
    from audio8_coreai.errors import ConfigError

    texts, seeds = list(TEXTS[:2]), [4, 5]
    fitting = tts_fp32.generate_batch(texts, seeds=seeds, max_frames=6, max_batch=2)
    huge = tts_fp32.generate_batch(texts, seeds=seeds, max_frames=6, max_batch=10**9)
    for a, b in zip(fitting, huge):
        np.testing.assert_array_equal(a.codes, b.codes)
    cfg = tts_fp32.config
    row = 2 * cfg.n_layer * cfg.n_local_heads * cfg.max_seq_len * cfg.head_dim * 4  # fp32 k and v
    rows = device_memory_bytes(tts_fp32.backend.device) // row + 1
    with pytest.raises(ConfigError, match=r"lower --batch \(max_batch\)") as e:
        tts_fp32.batched(rows)
    assert e.value.field == "max_batch"
