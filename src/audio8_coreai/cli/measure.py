"""``audio8 parity | gate | bench``: the tools that measure the port (oracle parity, the speech gate, speed)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Annotated

import typer

from ..checkpoint import DEFAULT_MODEL
from ..errors import BackendError, ConfigError, PrecisionError
from ..settings import DEFAULTS, override
from .app import AssetsOpt, BackendOpt, CudaGraphsOpt, DeviceOpt, ModelOpt, app, described, err, friendly, out


@app.command()
@friendly
def parity(
    fixture: Annotated[Path, typer.Option(help="An oracle fixture.npz recorded from the publisher's code.")],
    model: ModelOpt = DEFAULT_MODEL,
    device: DeviceOpt = "cpu",
    precision: Annotated[
        str | None,
        typer.Option(
            "--precision",
            help="Torch precision to replay: fp32 (the parity criterion; the default), or bf16, fp16w, int16, "
            "int12, int8, int8-int16, int8-fp16w, int8-int8 (agreement counts). With --backend coreai: the "
            "assets' own, which a value given must be.",
        ),
    ] = None,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    cuda_graphs: CudaGraphsOpt = DEFAULTS.torch.cuda_graphs,
    tolerance: Annotated[
        float, typer.Option(help=described(DEFAULTS.measure, "tolerance", more=" (> 0)"))
    ] = DEFAULTS.measure.tolerance,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full report as JSON.")] = False,
) -> None:
    """Replay an oracle fixture; exit 0 only when fp32 parity holds (reports agreement counts for the other
    precisions). Core AI assets replay what their baked sampling allows and say what they skip."""
    from ..backends.choice import open_backend
    from ..checkpoint import load_checkpoint
    from ..measure.oracle import load_fixture
    from ..measure.parity import run_parity

    tolerance = override(DEFAULTS.measure, tolerance=tolerance).tolerance
    meta = load_fixture(fixture)[1]  # a missing or wrong fixture is said before the model or assets load (minutes)
    ckpt = load_checkpoint(model)
    if precision is None and backend == "torch":
        precision = "fp32"
    port = open_backend(ckpt, backend, device=device, precision=precision, assets=assets, cuda_graphs=cuda_graphs)
    exact = port.precision == "fp32"
    report = run_parity(port, fixture, tolerance)
    if as_json:
        out.print_json(report.to_json())
    else:
        _print_parity(report, exact)
    if not report.passed:
        _another_checkpoints(fixture, ckpt.model_file)
    run_dtype = meta.get("run_dtype", "float32")
    if exact and not report.passed and run_dtype != "float32":
        err.print(
            f"note: {fixture} was recorded with the publisher's code running in {run_dtype} (its meta's run_dtype), "
            "and fp32 parity is judged against an fp32 recording: replay it with --precision bf16 for its "
            "agreement counts",
            highlight=False,
            soft_wrap=True,
        )
    if exact and not report.passed:
        raise typer.Exit(1)


def _print_parity(report, exact: bool) -> None:
    for s in report.scenarios:
        free = (
            ""
            if s.free_run_identical is None
            else (
                f", free run {'identical' if s.free_run_identical else 'DIFFERS'} "
                f"({s.free_run_frames}/{s.free_run_expected_frames} frames, eos {s.free_run_eos})"
            )
        )
        out.print(
            f"{s.name:8s} steps {s.steps:3d}  max|dlogit| slow {s.slow_logits_max_diff:.2e} fast "
            f"{s.fast_logits_max_diff:.2e}  argmax {s.slow_argmax[0]}/{s.slow_argmax[1]}  semantic draws "
            f"{s.semantic_draws[0]}/{s.semantic_draws[1]}  codebook draws {s.codebook_draws[0]}/"
            f"{s.codebook_draws[1]}{free}",
            highlight=False,
        )
    for c in report.codec:
        stages = ", ".join(f"{k} {v:.1e}" for k, v in c.intermediates_max_diff.items())
        out.print(
            f"codec {c.name:16s} max|dwave| {c.waveform_max_diff:.2e} cos {c.waveform_cos:.6f}"
            f"{f' ({stages})' if stages else ''}",
            highlight=False,
        )
    for e in report.encoder:
        latent = "" if e.latent_max_diff is None else f"  max|dlatent| {e.latent_max_diff:.2e}"
        out.print(f"encoder {e.name:14s} codes {e.codes_equal[0]}/{e.codes_equal[1]} equal{latent}", highlight=False)
    for reason in report.skipped:
        out.print(f"skipped {reason}", highlight=False)
    verdict = "PASS" if report.passed else "FAIL"
    if exact:
        out.print(f"fp32 parity (tolerance {report.tolerance:g}): {verdict}  [{report.backend}]", highlight=False)
    else:  # the fp32 criterion does not apply: the counts above are the result
        out.print(
            f"agreement of a non-fp32 precision (the counts above; fp32 parity, tolerance "
            f"{report.tolerance:g}, would be {verdict})  [{report.backend}]",
            highlight=False,
        )


@app.command()
@friendly
def gate(
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Report folder: report.json, report.md, PNG pictures, the wavs (new, empty, or a former report's, "
            "replaced whole when this one is done).",
        ),
    ],
    model: ModelOpt = DEFAULT_MODEL,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    device: DeviceOpt = "auto",
    precision: Annotated[
        str | None,
        typer.Option(
            "--precision",
            help="The port's precision on torch (precision.py's names: fp32, the default, bf16, fp16w, int16, "
            "int12, int8, int8-int16, int8-fp16w, int8-int8); a non-fp32 one is judged by its speech, "
            "its tensors reported. With --backend coreai: the assets' own, which a value given must be.",
        ),
    ] = None,
    against: Annotated[
        str,
        typer.Option(
            help="fp32 (the checkpoint in fp32 torch, over --fixtures) or an "
            "oracle fixture.npz recorded for this checkpoint."
        ),
    ] = "fp32",
    fixtures: Annotated[
        Path | None,
        typer.Option(help="Fixtures JSON (default: the shipped set of 16 across en/ja/zh/de/fr/es/ko with 4 clones)."),
    ] = None,
    fixture: Annotated[list[str] | None, typer.Option("--fixture", help="Run only this fixture (repeatable).")] = None,
    reference_device: Annotated[str, typer.Option(help="Device of the fp32 reference run.")] = "cpu",
    max_frames: Annotated[
        int | None, typer.Option(help="Frame cap per free run (default: the checkpoint's max_new_tokens).")
    ] = None,
    asr_margin: Annotated[
        float, typer.Option(help=described(DEFAULTS.measure, "asr_margin", more=" (absolute, against the reference)"))
    ] = DEFAULTS.measure.asr_margin,
    speaker_margin: Annotated[
        float, typer.Option(help=described(DEFAULTS.measure, "speaker_margin", more=" (against the reference)"))
    ] = DEFAULTS.measure.speaker_margin,
    recognizer: Annotated[
        list[str] | None,
        typer.Option(
            metavar="MODULE:CALLABLE",
            help="A stronger recogniser, MODULE:CALLABLE: fn(audio float32 [N], sample_rate Hz, language code) -> "
            "text, for the languages in its optional `languages` attribute (else all); imported from the current "
            "folder or PYTHONPATH; repeatable, the first that covers a language is used, pocketsphinx after.",
        ),
    ] = None,
) -> None:
    """Judge the port by its speech: teacher-forced agreement, codec, free run, ASR round trip and speaker
    similarity against an fp32 run or an oracle fixture; exit 1 when a verdict fails."""
    from ..measure.gate import default_recognizers, load_recognizer, run_gate

    margins = override(DEFAULTS.measure, asr_margin=asr_margin, speaker_margin=speaker_margin)
    recognizers = None  # the defaults, and why they are missing if they are
    if recognizer:
        recognizers = [load_recognizer(spec) for spec in recognizer] + default_recognizers()[0]
    report = run_gate(
        model,
        out_dir,
        against=against,
        backend=backend,
        device=device,
        precision=precision,
        assets=assets,
        fixtures=fixtures,
        names=fixture,
        reference_device=reference_device,
        max_frames=max_frames,
        recognizers=recognizers,
        asr_margin=margins.asr_margin,
        speaker_margin=margins.speaker_margin,
        log=lambda line: err.print(line, highlight=False),
    )
    t = report.totals()
    out.print(
        f"teacher-forced: semantic {t['semantic_draws'][0]}/{t['semantic_draws'][1]}, codebook "
        f"{t['codebook_draws'][0]}/{t['codebook_draws'][1]}, misses {t['misses']} ({t['misses_low_margin']} "
        f"near-ties); free runs identical {t['free_run_identical'][0]}/{t['free_run_identical'][1]}",
        highlight=False,
        soft_wrap=True,
    )
    for key, verdict in report.verdicts.items():
        if isinstance(verdict, dict):
            verdict = ", ".join(f"{k} {v}" for k, v in verdict.items()) or "skipped (why: below)"
        out.print(f"{key}: {verdict}", highlight=False, soft_wrap=True)
    reasons = [f"asr {lang}: {a['skipped']}" for lang, a in report.asr.items() if "skipped" in a]
    if report.speaker and "skipped" in report.speaker:
        reasons.append(f"speaker: {report.speaker['skipped']}")
    for reason in reasons:  # a skipped rung does not fail the gate: say why it was not judged
        out.print(f"  skipped {reason}", highlight=False, soft_wrap=True)
    out.print(f"gate {'PASS' if report.passed else 'FAIL'}: {out_dir / 'report.md'}", highlight=False, soft_wrap=True)
    if not report.passed:
        if against != "fp32":
            from ..checkpoint import load_checkpoint

            _another_checkpoints(Path(against).expanduser(), load_checkpoint(model).model_file)
        raise typer.Exit(1)


def _another_checkpoints(fixture: Path, model_file: Path) -> None:
    """A note when the oracle ``fixture`` a replay failed was recorded from a checkpoint whose weights are not
    ``model_file``'s (:func:`..measure.oracle.recorded_from_another`): the likely cause, and the fix."""
    from ..measure.oracle import recorded_from_another

    recorded = recorded_from_another(fixture, model_file)
    if recorded is not None:
        err.print(
            f"note: {fixture} was recorded from the checkpoint in {recorded}, whose weights differ from "
            f"{model_file}: run with --model {recorded}",
            highlight=False,
            soft_wrap=True,
        )


@app.command()
@friendly
def bench(
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            "-m",
            help="A 0.6b checkpoint folder; the default folder gets a random one (seed 0, about 2.8 GB) when absent.",
        ),
    ] = Path(DEFAULTS.bench.checkpoint),
    precision: Annotated[
        list[str] | None,
        typer.Option(
            help="Torch precision to measure (repeatable): fp32, bf16, fp16w, int16, int12, int8, int8-int16, "
            "int8-fp16w, int8-int8."
        ),
    ] = None,
    threads: Annotated[list[int] | None, typer.Option(help="Torch threads (repeatable; default torch's).")] = None,
    baseline: Annotated[
        bool,
        typer.Option(
            help="Also time the publisher-style frame (fp32, full head, host "
            "sampling, one call per fast row) for the vs-base ratio."
        ),
    ] = False,
    device: DeviceOpt = DEFAULTS.bench.device,
    frames: Annotated[
        int, typer.Option(help=described(DEFAULTS.bench, "frames", more="; eos ignored"))
    ] = DEFAULTS.bench.frames,
    runs: Annotated[int, typer.Option(help=described(DEFAULTS.bench, "runs"))] = DEFAULTS.bench.runs,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write every figure here.")] = None,
    codec_dtype: Annotated[
        list[str] | None,
        typer.Option(
            help="Codec dtype (repeatable): fp32 (default on CPU, exact), bf16 (opt-in, faster, not exact) or tf32"
            " (CUDA: fp32 with TF32 convolutions, not exact)."
        ),
    ] = None,
    cuda_graphs: Annotated[
        bool,
        typer.Option(
            "--cuda-graphs",
            help="With --device cuda: also time each configuration with its frame replayed as one CUDA graph.",
        ),
    ] = False,
    rss: Annotated[
        bool,
        typer.Option(
            "--rss/--no-rss",
            help="Measure each configuration's peak RSS alone in a subprocess of its own (one more load each).",
        ),
    ] = True,
) -> None:
    """Speed and memory: prefill, ms/frame (slow, fast, sampler), weight-streaming floor, codec, RTF, TTFA, RSS."""
    from ..backends.torch import resolve_codec_dtype, resolve_device
    from ..checkpoint import load_checkpoint
    from ..measure.bench import ensure_checkpoint, format_table, meta, run_configs
    from ..precision import resolve_precision, runtime_of

    base = override(DEFAULTS.bench, checkpoint=str(model.expanduser()), device=device, frames=frames, runs=runs)
    if cuda_graphs and not device.startswith("cuda"):
        raise ConfigError(f"--cuda-graphs times CUDA graphs: add --device cuda (not {device})")
    # Checked here, not in the worker after minutes of loading: the device, every precision and codec dtype, and
    # where the JSON goes.
    dev = resolve_device(device)
    runtime = runtime_of("torch", dev.type)
    for name in precision or []:
        resolve_precision(name, runtime)
    for name in codec_dtype or []:
        resolve_codec_dtype(name, dev)
    if json_out is not None:  # checked before minutes of measuring, which a failed write would lose
        json_out = json_out.expanduser()
        folder = json_out.parent
        if json_out.is_dir():
            raise ConfigError(f"--json {json_out} is a folder: give a file name such as {json_out / 'bench.json'}")
        if not folder.is_dir():
            said = "is a file, not a folder" if folder.exists() else "does not exist"
            raise ConfigError(f"--json {json_out}: {folder} {said}: write elsewhere")
        existed = json_out.exists()
        try:  # a real write, not permission bits: root passes those where the file system still refuses (/proc)
            with open(json_out, "a"):
                pass
        except OSError as e:
            raise ConfigError(f"--json {json_out} cannot be written ({e.strerror}): write elsewhere") from None
        if not existed:
            json_out.unlink()
    thread_list = threads or [DEFAULTS.bench.threads]
    cpus = len(os.sched_getaffinity(0))
    if over := [t for t in thread_list if t is not None and t > cpus]:  # they would only wait on each other
        raise ConfigError(f"--threads {over[0]}: this process may run on {cpus} CPUs: give at most {cpus}", "threads")
    configs = [override(base, threads=t, precision="fp32", baseline=True) for t in thread_list] if baseline else []
    configs += [
        override(base, precision=p, threads=t, codec_dtype=c, cuda_graphs=g)
        for p in precision or [DEFAULTS.bench.precision]
        for t in thread_list
        for c in codec_dtype or [DEFAULTS.bench.codec_dtype]
        for g in ((False, True) if cuda_graphs else (DEFAULTS.bench.cuda_graphs,))
    ]
    for config in configs:  # the precisions the settings gave too (AUDIO8_BENCH__PRECISION), not only the options
        try:
            resolve_precision(config.precision, runtime)
        except PrecisionError as e:
            raise ConfigError(f"{e} (--precision, or AUDIO8_BENCH__PRECISION for its default)", "precision") from None
    log = functools.partial(err.print, highlight=False)
    ensure_checkpoint(model, log)
    context = load_checkpoint(model).config.max_seq_len  # the exact room (less the prompt) is the worker's check
    if frames >= context:
        raise ConfigError(f"--frames {frames} does not fit the checkpoint's context of {context}: give fewer", "frames")
    busy = meta()["load_average"][0]
    if busy > 0.5:
        log(
            f"[yellow]warning:[/] load average {busy:.1f} before starting: other processes use the CPU, so times "
            "are inflated and noisy (see CPU use); compare rows of one run"
        )
    try:
        rows = run_configs(configs, log, rss=rss)
    except RuntimeError as e:
        raise BackendError(str(e)) from None
    out.print(format_table(rows), highlight=False, soft_wrap=True)
    if json_out is not None:
        json_out.write_text(json.dumps({"meta": meta(), "results": rows}, indent=2) + "\n")
        log(f"wrote {json_out}")
