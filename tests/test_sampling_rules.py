"""The sampler's rules on hand-made cases, and torch against its own NumPy reference on random inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from audio8_coreai.config import SamplingParams
from audio8_coreai.sampling import CANDIDATES, NoiseSource, greedy_semantic, sample_semantic, sample_top_k_top_p
from audio8_coreai.sampling_reference import np_sample_semantic, np_sample_top_k_top_p
from tests.sampling_support import EOS, SEM_BEGIN, V, W

# --- the publisher's rule on hand-made cases -------------------------------------------------------------------


def _both(logits, u, k, p, t) -> int:
    """Torch and NumPy draw; they must agree."""
    got = int(sample_top_k_top_p(torch.tensor(logits), torch.tensor(u), k, p, t))
    assert got == int(np_sample_top_k_top_p(np.array(logits, np.float32), np.array(u, np.float32), k, p, t))
    return got


def test_top_p_drops_the_crossing_token_and_keeps_ties_by_index():
    # four equal logits carry exactly 1/4 each; the noise favours index 3, then 2, then 1
    logits = [0.0, 0.0, 0.0, 0.0, -1e4, -1e4]
    u = [0.5, 0.9, 0.99, 0.999, 0.9999, 0.9999]
    assert _both(logits, u, 50, 0.5, 1.0) == 1  # cum 0.25, 0.5 kept (not > 0.5), 0.75 dropped
    assert _both(logits, u, 50, 0.75, 1.0) == 2
    assert _both(logits, u, 50, 0.49, 1.0) == 0
    assert _both(logits, u, 50, 1e-9, 1.0) == 0  # rank 0 is always kept
    assert _both(logits, u, 2, 1.0, 1.0) == 1  # top-k cut inside the tie: the two lowest indices
    assert _both(logits, u, 1000, 1.0, 1.0) == 3  # top_k > N: all kept; indices 4, 5 weigh exactly 0


def test_top_p_is_judged_before_the_temperature():
    # raw probs 0.46, 0.28, 0.25: top_p 0.8 keeps two. Tempering first (T 0.1) would leave only index 0.
    logits, u = [0.0, -0.5, -0.6], [0.5, 0.99999, 0.5]
    assert _both(logits, u, 50, 0.8, 0.1) == 1


def test_temperature_is_clamped():
    # at T 1e-5 index 1 keeps weight 0.475 and its noise wins; unclamped, 1e-30 would leave index 0 alone
    logits, u = [0.0, -1e-6, -5.0], [0.3, 0.99999, 0.5]
    assert _both(logits, u, 50, 1.0, 1e-30) == _both(logits, u, 50, 1.0, 1e-5) == 1


def test_equal_race_values_go_to_the_lowest_vocabulary_index_not_the_best_rank():
    """Index 1 ranks first (higher logit); pick index 0's noise so both race values are exactly equal in fp32
    (found by search, computed as the sampler does); the publisher's argmax over the vocabulary returns 0."""
    q = torch.softmax(torch.tensor([1.0, 0.0]), -1)  # ranked: index 1, index 0
    u_top = 0.3
    target = math.exp(-q[1].item() / (q[0].item() / -math.log(u_top)))
    for k in range(int(target * 2**24) - 64, int(target * 2**24) + 64):
        race = q / -torch.log(torch.tensor([u_top, k / 2**24]))
        if race[0] == race[1]:
            break
    else:
        pytest.fail("no exact tie found")
    logits = torch.tensor([0.0, 1.0])
    assert int(sample_top_k_top_p(logits, torch.tensor([k / 2**24, u_top]), 2, 1.0, 1.0)) == 0
    assert int(sample_top_k_top_p(logits, torch.tensor([(k - 1) / 2**24, u_top]), 2, 1.0, 1.0)) == 1


def test_semantic_ties_follow_vocabulary_order_eos_first():
    """eos (id 2) sorts before the semantic ids: on equal logits it wins the top-1 place and equal race values,
    although it is the last compact index."""
    logits = torch.full((V + 1,), -20.0)
    logits[0] = logits[V] = 5.0  # semantic id 300 and eos
    noise = torch.full((2, V + 1), 0.5)
    empty = torch.full((W,), -1, dtype=torch.int64)
    for k in (1, 50):
        kw = dict(
            params=SamplingParams(top_k=k, top_p=0.9, temperature=0.7, ras_top_p=0.9, ras_temperature=1.0),
            semantic_begin_id=SEM_BEGIN,
            eos_id=EOS,
        )
        sem, normal, high = sample_semantic(logits, noise, empty, **kw)
        assert int(sem) == int(normal) == int(high) == EOS
        assert int(np_sample_semantic(logits.numpy(), noise.numpy(), empty.numpy(), **kw)[0]) == EOS
    assert int(greedy_semantic(logits, semantic_begin_id=SEM_BEGIN, eos_id=EOS)) == EOS


def test_ras_replaces_only_semantic_ids_found_in_the_window():
    logits = torch.zeros(V + 1)
    noise = torch.full((2, V + 1), 0.5)
    noise[0, 7] = 0.9999  # normal draw: id 307
    noise[1, 9] = 0.9999  # high draw: id 309
    noise[0, V] = noise[1, V] = 1e-7  # eos: never
    kw = dict(
        params=SamplingParams(top_k=300, top_p=1.0, temperature=1.0, ras_top_p=1.0, ras_temperature=1.0),
        semantic_begin_id=SEM_BEGIN,
        eos_id=EOS,
    )

    def draw(window: list[int]) -> int:
        w = torch.tensor(window)
        ours = int(sample_semantic(logits, noise, w, **kw)[0])
        assert ours == int(np_sample_semantic(logits.numpy(), noise.numpy(), w.numpy(), **kw)[0])
        return ours

    assert draw([-1] * W) == 307
    assert draw([0] * W) == 307
    assert draw([0] * (W - 1) + [307]) == 309
    assert draw([307] + [0] * (W - 1)) == 309
    assert draw([306, 308] + [0] * (W - 2)) == 307
    noise[0, V] = 0.9999999  # normal draw eos: never replaced, even when eos is in the window
    assert draw([EOS] * W) == EOS


@pytest.mark.parametrize("eos_id", [EOS, SEM_BEGIN + V + 5])
def test_sample_semantic_matches_reference_with_eos_below_or_above_the_semantic_ids(eos_id):
    """Random logits with ties (integers), noise and windows holding recent draws; eos sorts first or last."""
    rng = np.random.default_rng(eos_id)
    logits = rng.integers(0, 6, (64, V + 1)).astype(np.float32)
    logits[:, V] += rng.integers(0, 2, 64)  # eos often tied with the best semantic ids
    noise = rng.choice([0.2, 0.5, 0.8], (64, 2, V + 1)).astype(np.float32)
    window = SEM_BEGIN + rng.integers(0, 40, (64, W))  # ties favour low ids: draws land in here
    window[::3] = -1
    kw = dict(
        params=SamplingParams(top_k=50, top_p=0.9, temperature=0.7, ras_top_p=0.9, ras_temperature=1.0),
        semantic_begin_id=SEM_BEGIN,
        eos_id=eos_id,
    )
    ours = sample_semantic(torch.from_numpy(logits), torch.from_numpy(noise), torch.from_numpy(window), **kw)
    ref = np_sample_semantic(logits, noise, window, **kw)
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a.numpy(), b)
    assert (ref[1] == eos_id).any() and (ref[0] != ref[1]).any()  # both eos and RAS replacements occur


# --- torch against the NumPy reference on random inputs --------------------------------------------------------

SETTINGS = [
    (50, 0.9, 0.7),
    (50, 0.9, 1.0),
    (1, 0.9, 0.7),
    (5, 1.0, 1.3),
    (1000, 0.5, 0.2),
    (50, 1e-6, 0.7),
    (3, 0.75, 1e-7),
    (50, 2.0, 5.0),
]


def _random_logits(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    if kind == "peaked":
        return (rng.standard_normal(shape) * 8).astype(np.float32)
    if kind == "flat":
        return (rng.standard_normal(shape) * 0.01).astype(np.float32)
    if kind == "ties":  # few distinct values: ties at the top-k and top-p cuts
        return rng.integers(0, 4, shape).astype(np.float32)
    return (rng.standard_normal(shape) * 3).astype(np.float32)


@pytest.mark.parametrize("shape", [(7,), (3, 64), (2, 3, 257), (2, 4097)])
@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "normal"])
@pytest.mark.parametrize("candidates", CANDIDATES)
def test_torch_matches_numpy_reference(shape, kind, candidates):
    """Every way of finding the candidates (eager, CUDA graphs' stable sort, export's rank count) draws the
    reference's index, ties at the cuts and in the race included."""
    rng = np.random.default_rng(sum(shape) * 10 + len(kind))
    for k, p, t in SETTINGS:
        logits = _random_logits(rng, kind, shape)
        if kind == "ties":  # few noise values too: exact ties in the race
            u = rng.choice([0.25, 0.5, 0.75], shape).astype(np.float32)
        else:
            u = rng.random(shape, dtype=np.float32) + np.float32(2**-25)
        got = sample_top_k_top_p(torch.from_numpy(logits), torch.from_numpy(u), k, p, t, candidates=candidates)
        assert got.shape == shape[:-1] and got.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), np_sample_top_k_top_p(logits, u, k, p, t), err_msg=f"{k} {p} {t}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_sampled_in_fp32(dtype):
    """bf16/fp16 logits (many ties after rounding) give the reference's draws on their fp32 values."""
    rng = np.random.default_rng(3)
    for k, p, t in SETTINGS:
        logits = torch.from_numpy(rng.standard_normal((64, 257)).astype(np.float32) * 4).to(dtype)
        u = rng.random((64, 257), dtype=np.float32) + np.float32(2**-25)
        got = sample_top_k_top_p(logits, torch.from_numpy(u), k, p, t)
        np.testing.assert_array_equal(got.numpy(), np_sample_top_k_top_p(logits.float().numpy(), u, k, p, t))


def test_sampler_exports_with_static_shapes():
    """torch.export traces the whole semantic + codebook draw (no data-dependent Python control flow) and the
    exported program draws what eager does."""

    class Draw(torch.nn.Module):
        def forward(self, logits, noise, window, fast_logits, fast_noise):
            sem = sample_semantic(logits, noise, window, SamplingParams(), SEM_BEGIN, EOS)
            return (*sem, sample_top_k_top_p(fast_logits, fast_noise, 50, 0.9, 0.7))

    g = torch.Generator().manual_seed(0)
    window = torch.tensor([[-1] * W, [0] * (W - 1) + [SEM_BEGIN + 4]])
    args = (
        torch.randn(2, V + 1, generator=g),
        torch.rand(2, 2, V + 1, generator=g),
        window,
        torch.randn(2, 9, V, generator=g),
        torch.rand(2, 9, V, generator=g),
    )
    exported = torch.export.export(Draw(), args).module()
    for a, b in zip(exported(*args), Draw()(*args)):
        assert torch.equal(a, b)


def test_bad_settings_are_refused():
    x, u = torch.zeros(4), torch.full((4,), 0.5)
    for k, p, t in [(0, 0.9, 0.7), (50, 0.0, 0.7), (50, 0.9, 0.0), (2.5, 0.9, 0.7)]:
        with pytest.raises(ValueError):
            sample_top_k_top_p(x, u, k, p, t)


# --- product noise ---------------------------------------------------------------------------------------------


def test_noise_source_is_deterministic_per_seed_and_never_zero():
    a, b, c = NoiseSource(7, V, V), NoiseSource(7, V, V), NoiseSource(8, V, V)
    for _ in range(20):
        (sa, fa), (sb, fb), (sc, fc) = a.next_frame(), b.next_frame(), c.next_frame()
        assert sa.shape == (2, V + 1) and fa.shape == (9, V) and sa.dtype == fa.dtype == np.float32
        np.testing.assert_array_equal(sa, sb)
        np.testing.assert_array_equal(fa, fb)
        assert not np.array_equal(sa, sc) and not np.array_equal(fa, fc)
        for x in (sa, fa):
            assert x.min() > 0 and x.max() < 1
    # the real head: 4,097 semantic uniforms and 9 x 4,096 codebook uniforms per frame; a second frame differs
    real = NoiseSource(0, 4096, 4096)
    first, second = real.next_frame(), real.next_frame()
    assert first[0].shape == (2, 4097) and first[1].shape == (9, 4096)
    assert not np.array_equal(first[0], second[0])
    assert 0.49 < first[1].mean() < 0.51


def test_noise_drawn_ahead_is_the_same_stream():
    """The stream drawn one step ahead on the noise threads gives the seeded stream's values in order."""
    from audio8_coreai.engine.noise import NoiseAhead

    plain, ahead = NoiseSource(7, V, 64, 3), NoiseAhead(NoiseSource(7, V, 64, 3))
    for _ in range(5):
        (a_slow, a_fast), (b_slow, b_fast) = plain.next_frame(), ahead.next_frame()
        assert a_slow.shape == (2, V + 1) and a_fast.shape == (3, 64)
        np.testing.assert_array_equal(a_slow, b_slow)
        np.testing.assert_array_equal(a_fast, b_fast)


def test_noise_drawn_ahead_or_now_is_the_same_stream():
    """A step whose draw was not started ahead (no :meth:`NoiseAhead.ahead` since the last) is drawn when asked, and
    a second ``ahead`` before the step is taken starts nothing more: the seeded values in order either way."""
    from audio8_coreai.engine.noise import NoiseAhead

    plain, ahead = NoiseSource(3, V, 64, 2), NoiseAhead(NoiseSource(3, V, 64, 2))
    for started in (1, 0, 2, 0, 0, 1):
        for _ in range(started):
            ahead.ahead()
        (a_slow, a_fast), (b_slow, b_fast) = plain.next_frame(), ahead.next_frame()
        np.testing.assert_array_equal(a_slow, b_slow)
        np.testing.assert_array_equal(a_fast, b_fast)
