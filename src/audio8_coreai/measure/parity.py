"""Replay an oracle fixture (recorded from the publisher's code) through a backend and measure the port.

Three stages per scenario (oracle README, "What matches means"):
1. teacher-forced on the recorded columns: max |logit diff| (slow and fast), argmax agreement, and
   whether the in-graph sampler draws what the publisher drew from the recorded uniforms;
2. free run with the recorded uniforms: identical codes frame for frame and eos at the same step;
3. codec: max |waveform diff| and the recorded intermediates (the waveform only, for backends other than torch);
4. codec encoder (``clone``): the reference clip's codes and the SEANet encoder latent.
fp32 passes when every logit, waveform and latent is within ``tolerance`` (1e-4) and every draw, code and eos
step is equal.

The torch backend replays a batch scenario as the recorded batch (:func:`replay_batch`); backends of batch-1
graphs (Core AI assets) replay each item alone up to its eos, teacher-forced and free run
(:func:`replay_forced` with ``item``). A backend whose graphs bake their sampling in (Core AI) replays only the
scenarios drawn with it and lists the others as skipped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..backends.base import Backend, FrameResult, StepInputs
from ..backends.torch import TorchBackend
from ..backends.torch.host_edge import frame_inputs, frame_results, prefilled
from ..config import SamplingParams
from ..engine.loop import generate
from ..errors import ParityError
from ..model.frame import packed
from ..model.layers import IndexKV, causal_cache_mask
from ..settings import DEFAULTS
from .oracle import _forced, _item_prompt, _params, _step_noise, load_fixture, recorded_noise
from .replay import replay
from .stats import cosine

SCENARIOS = ("plain", "greedy", "clone", "batch")
CODEC_SCENARIOS = ("plain", "greedy", "batch", "clone", "codec_clamp")


@dataclass
class DrawMiss:
    """One teacher-forced draw that differs from the recording: at ``step`` of batch ``item``, draw ``draw``
    (0: the semantic id, c >= 1: codebook c) recorded as ``want``, drawn by the backend as ``got``."""

    step: int
    item: int
    draw: int
    want: int
    got: int


@dataclass
class ScenarioReport:
    """Agreement for one scenario; counts are (agreeing, total); ``misses`` lists every draw that differs;
    ``free_run_prefix`` is how many leading free-run frames equal the recording's (all codebooks).
    ``name`` is the scenario's, or ``batch[i]`` for item i of a batch scenario replayed alone (``scenario`` then
    names the fixture's scenario)."""

    name: str
    steps: int
    slow_logits_max_diff: float = 0.0
    fast_logits_max_diff: float = 0.0
    slow_argmax: tuple[int, int] = (0, 0)
    semantic_draws: tuple[int, int] = (0, 0)
    codebook_draws: tuple[int, int] = (0, 0)
    free_run_identical: bool | None = None
    free_run_frames: int | None = None
    free_run_prefix: int | None = None
    free_run_expected_frames: int | None = None
    free_run_eos: bool | None = None
    free_run_expected_eos: bool | None = None
    slow_logits_min_cos: float = 1.0
    fast_logits_min_cos: float = 1.0
    misses: list[DrawMiss] = field(default_factory=list)
    scenario: str | None = None

    @property
    def key(self) -> str:
        """The fixture's scenario key (``batch`` for ``batch[1]``)."""
        return self.scenario or self.name


@dataclass
class CodecReport:
    name: str
    waveform_max_diff: float
    intermediates_max_diff: dict[str, float]
    waveform_cos: float = 1.0


@dataclass
class EncoderReport:
    """The codec encoder on a recorded clip: ``codes_equal`` (equal, total) over the reference codes and
    the max |diff| of the SEANet encoder latent."""

    name: str
    codes_equal: tuple[int, int]
    latent_max_diff: float | None  # None: the backend does not expose the latent (Core AI)


@dataclass
class ParityReport:
    """The whole replay; ``passed`` is the fp32 criterion (exact draws, logits within tolerance)."""

    fixture: str
    backend: str
    tolerance: float
    scenarios: list[ScenarioReport] = field(default_factory=list)
    codec: list[CodecReport] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "scenario: why" for what this backend cannot replay
    encoder: list[EncoderReport] = field(default_factory=list)

    def totals(self) -> dict[str, tuple[int, int]]:
        out = {}
        for key in ("slow_argmax", "semantic_draws", "codebook_draws"):
            out[key] = (
                sum(getattr(s, key)[0] for s in self.scenarios),
                sum(getattr(s, key)[1] for s in self.scenarios),
            )
        return out

    @property
    def passed(self) -> bool:
        t = self.tolerance
        for s in self.scenarios:
            if s.slow_logits_max_diff > t or s.fast_logits_max_diff > t:
                return False
            for a, n in (s.slow_argmax, s.semantic_draws, s.codebook_draws):
                if a != n:
                    return False
            if s.free_run_identical is False:
                return False
        if any(e.codes_equal[0] != e.codes_equal[1] or (e.latent_max_diff or 0.0) > t for e in self.encoder):
            return False
        return all(
            c.waveform_max_diff <= t and max(c.intermediates_max_diff.values(), default=0) <= t for c in self.codec
        )

    def to_json(self) -> str:
        """The report as JSON: every field, each scenario's ``scenario`` its fixture key, the totals and verdict."""
        report = asdict(self)
        for scenario, said in zip(self.scenarios, report["scenarios"]):
            said["scenario"] = scenario.key  # None in the object where it is the name
        return json.dumps({**report, "totals": self.totals(), "passed": self.passed}, indent=2)


def _compare_frame(rep: ScenarioReport, fx, sc, s, b, res: FrameResult, do_sample: bool) -> None:
    rec_logits = fx[f"{sc}__slow_logits_compact"][s, b]
    rep.slow_logits_max_diff = max(rep.slow_logits_max_diff, float(np.abs(res.logits - rec_logits).max()))
    rep.slow_logits_min_cos = min(rep.slow_logits_min_cos, cosine(res.logits, rec_logits))
    rep.slow_argmax = _add(rep.slow_argmax, int(np.argmax(res.logits) == np.argmax(rec_logits)))
    rec_fast = fx[f"{sc}__fast_logits"][s, :, b]
    rep.fast_logits_max_diff = max(rep.fast_logits_max_diff, float(np.abs(res.fast_logits - rec_fast).max()))
    rep.fast_logits_min_cos = min(rep.fast_logits_min_cos, min(cosine(x, y) for x, y in zip(res.fast_logits, rec_fast)))
    rep.semantic_draws = _add(rep.semantic_draws, int(res.sampled_semantic == fx[f"{sc}__semantic"][s, b]))
    want = fx[f"{sc}__fast_choice"][s, :, b] if do_sample else fx[f"{sc}__codebooks"][s, b, 1:]
    agree = int((res.sampled_codes[1:] == want).sum())
    rep.codebook_draws = (rep.codebook_draws[0] + agree, rep.codebook_draws[1] + len(want))
    semantic = int(fx[f"{sc}__semantic"][s, b])
    if res.sampled_semantic != semantic:
        rep.misses.append(DrawMiss(s, b, 0, semantic, int(res.sampled_semantic)))
    rep.misses += [
        DrawMiss(s, b, int(c) + 1, int(want[c]), int(res.sampled_codes[c + 1]))
        for c in np.flatnonzero(res.sampled_codes[1:] != want)
    ]


def _add(pair: tuple[int, int], ok: int) -> tuple[int, int]:
    return pair[0] + ok, pair[1] + 1


def replay_single(backend: Backend, fx: dict, meta: dict, sc: str, item: int | None = None) -> ScenarioReport:
    """Teacher-forced and free-run replay of a batch-1 scenario, or of one ``item`` of a batch scenario on its
    own (:func:`replay_forced`), through the backend's public calls."""
    rep = replay_forced(backend, fx, meta, sc, item)
    # Free run: the engine's own loop, fed the recorded uniforms.
    cfg = backend.cfg
    max_new = int(meta["scenarios"][sc]["max_new_tokens"])
    noise = recorded_noise(fx, sc, item or 0, max_new, cfg)
    gen = generate(
        backend, _item_prompt(fx, sc, item), _params(meta, sc, backend), seed=0, max_frames=max_new, noise=noise
    )
    compare_free_run(rep, fx, sc, gen.codes, gen.reached_eos, item or 0)
    return rep


def replay_forced(backend: Backend, fx: dict, meta: dict, sc: str, item: int | None = None) -> ScenarioReport:
    """The teacher-forced half of :func:`replay_single`: every recorded step of batch-1 scenario ``sc``
    through the engine's loop (:func:`.replay.replay`), fed the recorded columns and uniforms; the loop computes
    the RAS windows and slots itself.

    With ``item``, batch ``item`` of a left-padded batch scenario is replayed alone (report ``sc[item]``): its
    prompt without the padding, each column at the slot of its RoPE position (the publisher hides the pads
    from every query, so the item's keys, positions and logits are the batch's), up to its eos step; the
    steps after it are not replayed (the publisher masks the finished item's later columns, which a batch-1
    graph cannot).
    """
    cfg = backend.cfg
    params = _params(meta, sc, backend)
    b = item or 0
    if item is None:
        steps = int(fx[f"{sc}__num_steps"])
        rep = ScenarioReport(sc, steps)
    else:
        steps = min(int(fx[f"{sc}__num_steps"]), int(fx[f"{sc}__code_lengths"][b]) + int(fx[f"{sc}__finished"][b]))
        rep = ScenarioReport(f"{sc}[{b}]", steps, scenario=sc)
    columns = np.stack([_forced(fx, sc, s, b) for s in range(steps)])
    results = replay(backend, _item_prompt(fx, sc, item), params, columns, recorded_noise(fx, sc, b, steps, cfg))
    for s, res in enumerate(results):
        _compare_frame(rep, fx, sc, s, b, res, params.do_sample)
    return rep


def compare_free_run(
    rep: ScenarioReport, fx: dict, sc: str, codes: np.ndarray, reached_eos: bool, item: int = 0
) -> None:
    """Fill ``rep``'s free-run fields from a free run's ``codes`` int [C, T] and whether it ended on eos,
    against the recording of scenario ``sc`` (batch ``item``)."""
    n_want = int(fx[f"{sc}__code_lengths"][item])
    want = fx[f"{sc}__codes"][item, :, :n_want]
    frames = codes.shape[1]
    rep.free_run_frames, rep.free_run_expected_frames = frames, n_want
    rep.free_run_eos, rep.free_run_expected_eos = reached_eos, bool(fx[f"{sc}__finished"][item])
    same = (codes[:, :n_want] == want[:, :frames]).all(axis=0)
    rep.free_run_prefix = len(same) if same.all() else int(np.argmin(same))
    rep.free_run_identical = (
        frames == n_want and reached_eos == rep.free_run_expected_eos and np.array_equal(codes, want)
    )


@torch.inference_mode()
def replay_batch(backend: TorchBackend, fx: dict, meta: dict, sc: str = "batch") -> ScenarioReport:
    """Teacher-forced replay of a left-padded batch: per-item RoPE positions and key masks as recorded.

    The publisher's batched prefill gives pad positions RoPE position 0 and hides them from every
    query; decode steps write slot ``prompt_width + s`` with RoPE position ``prompt_length_b + s``.
    """
    model, cfg, dev = backend.model, backend.cfg, backend.device
    params = _params(meta, sc, backend)
    ids = torch.as_tensor(fx[f"{sc}__prompt_input_ids"], device=dev)
    b, _, p = ids.shape
    k, v = model.new_kv_cache(batch=b)
    length = k.shape[3]
    key_valid = torch.zeros(b, length, dtype=torch.bool, device=dev)
    key_valid[:, :p] = torch.as_tensor(fx[f"{sc}__prompt_attention_mask"], device=dev).bool()
    mask = causal_cache_mask(torch.tensor([0], device=dev), p, length) & key_valid[:, None, None, :]
    rope = torch.as_tensor(fx[f"{sc}__prompt_position_ids"], device=dev)
    logits, hidden = model.slow(ids, rope, k, v, IndexKV(torch.arange(p, device=dev), mask))
    logits, hidden = logits[:, -1], hidden[:, -1]
    steps = int(fx[f"{sc}__num_steps"])
    rep = ScenarioReport(sc, steps)
    shapes = ((2, cfg.num_semantic + 1), (cfg.num_codebooks - 1, cfg.codebook_size))
    for s in range(steps):
        if s > 0:
            col = torch.as_tensor(fx[f"{sc}__step_input_column"][s - 1], device=dev)[:, :, None]
            slot = torch.as_tensor(fx[f"{sc}__step_physical_position"][s - 1], device=dev)
            key_valid[:, int(slot[0])] = torch.as_tensor(
                fx[f"{sc}__step_attention_mask_last"][s - 1], device=dev
            ).bool()
            mask = causal_cache_mask(slot, 1, length) & key_valid[:, None, None, :]
            rope = torch.as_tensor(fx[f"{sc}__step_token_position"][s - 1], device=dev)[:, None]
            logits, hidden = model.slow(col, rope, k, v, IndexKV(slot, mask))
            logits, hidden = logits[:, -1], hidden[:, -1]
        items = []  # each item's step as the frame loop packs one (its column and slot stepped above)
        for i in range(b):
            noise_slow, noise_fast = _step_noise(fx, sc, s, i, shapes)
            window = fx[f"{sc}__ras_previous"][s, i]
            items.append(StepInputs(None, 0, noise_slow, window, noise_fast, forced=_forced(fx, sc, s, i)))
        inputs = frame_inputs(cfg, items, dev)  # no column: each item drawn from the logits stepped above
        out = backend.frame_maths(params, inputs, None, None, prefilled(list(zip(logits, hidden))))
        for i, res in enumerate(frame_results(out, packed(out), range(b), [True] * b)):
            _compare_frame(rep, fx, sc, s, i, res, params.do_sample)
    return rep


@torch.inference_mode()
def replay_codec(backend: Backend, fx: dict, sc: str) -> list[CodecReport]:
    """Decode each item's recorded codes (valid prefix) and compare waveform and intermediates (the torch
    backend) or the waveform of the public ``decode_window`` (any other backend)."""
    codes = fx[f"{sc}__codes_in"] if sc == "codec_clamp" else fx[f"{sc}__codes"]
    lengths = fx[f"{sc}__decode_lengths"]
    hop = backend.checkpoint.codec_config.frame_length
    out = []
    for i in range(codes.shape[0]):
        n = int(lengths[i]) // hop
        stages = backend.codec_stages(codes[i : i + 1, :, :n])
        if stages is not None:
            wave = stages.pop("waveform")[0]
            recorded = {name: fx[f"{sc}__decode_item{i}_{name}"] for name in stages}
            diffs = {name: float(np.abs(val - recorded[name]).max()) for name, val in stages.items()}
        else:
            wave, diffs = backend.decode_window(codes[i, :, :n]), {}
        want = fx[f"{sc}__decode_waveform"][i, : n * hop]
        out.append(CodecReport(f"{sc}[{i}]", float(np.abs(wave - want).max()), diffs, cosine(wave, want)))
    return out


@torch.inference_mode()
def replay_encoder(backend: Backend, fx: dict, sc: str = "clone") -> EncoderReport:
    """Encode the scenario's recorded reference clip [N] (44.1 kHz) through the backend's public ``encode``
    and compare the codes with the publisher's; the latent is compared on the clip zero-padded to whole
    frames, as the publisher's ``encode`` pads it (SPEC.md section 8)."""
    audio = fx[f"{sc}__ref_audio"]
    n = int(fx[f"{sc}__ref_code_lengths"][0])
    want = fx[f"{sc}__ref_codes"][0, :, :n]
    codes = backend.encode(audio)
    equal = int((codes == want).sum()) if codes.shape == want.shape else 0
    padded = np.zeros(n * backend.checkpoint.codec_config.frame_length, dtype=np.float32)
    padded[: len(audio)] = audio
    latent = backend.encoder_latent(padded)
    diff = None if latent is None else float(np.abs(latent - fx[f"{sc}__ref_encoder_out"]).max())
    return EncoderReport(f"{sc}[0]", (equal, int(want.size)), diff)


def _cannot_replay(backend, meta: dict, sc: str) -> str | None:
    """Why ``backend`` cannot replay scenario ``sc`` (None: it can)."""
    # Backends with sampling baked into their graphs (Core AI assets) say which settings they draw with.
    params = _params(meta, sc, backend)
    if not backend.draws_like(params):
        fix = ": audio8 convert --greedy" if not params.do_sample else ""
        return (
            f"it draws {_describe(params)}; the backend's graphs bake in {_describe(backend.sampling)} (replay "
            f"it on assets converted with its sampling{fix})"
        )
    return None


def _describe(p: SamplingParams) -> str:
    if not p.do_sample:
        return "greedy (argmax)"
    return f"T {p.temperature:g} top-k {p.top_k} top-p {p.top_p:g} (RAS T {p.ras_temperature:g} top-p {p.ras_top_p:g})"


def run_parity(
    backend: Backend, fixture_path: str | Path, tolerance: float = DEFAULTS.measure.tolerance
) -> ParityReport:
    """Every scenario of an oracle fixture through ``backend``; see the module docstring.

    Raises ParityError when the fixture does not belong to the backend's checkpoint (other sizes).
    """
    fx, meta = load_fixture(fixture_path)
    cfg = backend.cfg
    rec_v = fx["plain__slow_logits_compact"].shape[-1] if "plain__slow_logits_compact" in fx else None
    if rec_v != cfg.num_semantic + 1 or meta.get("config", {}).get("dim") != cfg.dim:
        raise ParityError(
            f"fixture {fixture_path} was recorded for another checkpoint (compact head {rec_v}, "
            f"dim {meta.get('config', {}).get('dim')}; this model: {cfg.num_semantic + 1}, "
            f"{cfg.dim}); use the fixture of the checkpoint given with --model"
        )
    report = ParityReport(str(fixture_path), backend.description, tolerance)
    for sc in SCENARIOS:
        if f"{sc}__num_steps" not in fx:
            continue
        batch = fx[f"{sc}__prompt_input_ids"].shape[0]
        reason = _cannot_replay(backend, meta, sc)
        if reason:
            report.skipped.append(f"{sc}: {reason}")
        elif batch == 1:
            report.scenarios.append(replay_single(backend, fx, meta, sc))
        elif backend.batches:
            report.scenarios.append(replay_batch(backend, fx, meta, sc))
        else:  # batch-1 graphs (Core AI assets): each item alone, see replay_forced
            report.scenarios += [replay_single(backend, fx, meta, sc, b) for b in range(batch)]
    for sc in CODEC_SCENARIOS:
        if f"{sc}__decode_waveform" in fx:
            report.codec.extend(replay_codec(backend, fx, sc))
    if "clone__ref_audio" in fx:
        report.encoder.append(replay_encoder(backend, fx))
    return report
