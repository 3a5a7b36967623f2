"""``audio8 serve``: the OpenAI-compatible speech server."""

from __future__ import annotations

import os
import typing
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ..checkpoint import DEFAULT_MODEL, is_hub_id
from ..errors import ConfigError, VoiceError
from ..packages import install_extra
from ..settings import DEFAULTS, RaySettings, SampleRate, ServerSettings, override
from .app import (
    AssetsOpt,
    BackendOpt,
    CodecProcessOpt,
    CudaGraphsOpt,
    DeviceOpt,
    ModelOpt,
    PrecisionOpt,
    VoicesOpt,
    app,
    check_port,
    described,
    err,
    friendly,
)

if TYPE_CHECKING:
    from ..tts import TTS


@app.command()
@friendly
def serve(
    host: Annotated[str, typer.Option(help=described(DEFAULTS.server, "host"))] = DEFAULTS.server.host,
    port: Annotated[int, typer.Option(help=described(DEFAULTS.server, "port"))] = DEFAULTS.server.port,
    model: ModelOpt = DEFAULT_MODEL,
    voices: VoicesOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = None,
    cuda_graphs: CudaGraphsOpt = DEFAULTS.torch.cuda_graphs,
    codec_process: CodecProcessOpt = DEFAULTS.torch.codec_process,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    workers: Annotated[int, typer.Option(help=described(DEFAULTS.server, "workers"))] = DEFAULTS.server.workers,
    max_queue: Annotated[int, typer.Option(help=described(DEFAULTS.server, "max_queue"))] = DEFAULTS.server.max_queue,
    max_frames: Annotated[
        int | None, typer.Option(help=described(DEFAULTS.server, "max_frames"))
    ] = DEFAULTS.server.max_frames,
    chunk_frames: Annotated[
        int, typer.Option(help=described(DEFAULTS.speech, "chunk_frames"))
    ] = DEFAULTS.server.chunk_frames or DEFAULTS.speech.chunk_frames,
    first_chunk_frames: Annotated[
        int | None,
        typer.Option(
            help=described(
                DEFAULTS.speech,
                "first_chunk_frames",
                more=f" (default {DEFAULTS.speech.first_chunk_frames}, at most --chunk-frames)",
            )
        ),
    ] = DEFAULTS.server.first_chunk_frames,
    max_input_chars: Annotated[
        int, typer.Option(help=described(DEFAULTS.server, "max_input_chars"))
    ] = DEFAULTS.server.max_input_chars,
    max_upload_mb: Annotated[
        float, typer.Option(help="Largest voice upload in MB (2**20 bytes); 30 s of 96 kHz stereo float wav is 22 MB.")
    ] = DEFAULTS.server.max_upload_bytes / 2**20,
    batch: Annotated[
        int | None,
        typer.Option(
            help=described(
                DEFAULTS.server,
                "batch",
                more=f" (torch backend; replaces --workers; on a CUDA device without --workers, "
                f"{DEFAULTS.server.cuda_batch} unless given)",
            ),
            show_default=str(DEFAULTS.server.batch),
        ),
    ] = None,
    sample_rate: Annotated[
        int | None,
        typer.Option(
            help="Sample rate (Hz) of every response body unless a request asks another (one of "
            f"{', '.join(map(str, typing.get_args(SampleRate)))}; default: pcm {DEFAULTS.server.pcm_sample_rate} "
            "as OpenAI's, the rest the model's 44100; opus is always 48000)."
        ),
    ] = DEFAULTS.server.sample_rate,
    voice_map: Annotated[
        str | None,
        typer.Option(
            help="OpenAI voice names onto stored voices, e.g. alloy=ana,echo=bob (each must be stored).",
            show_default=",".join(f"{k}={v}" for k, v in DEFAULTS.server.voice_map.items()) or False,
        ),
    ] = None,
    default_voice: Annotated[
        str | None,
        typer.Option(
            help="Stored voice of requests naming none (or an unmapped OpenAI name); default: the model's own "
            "voice, with a fixed seed when the request gives none."
        ),
    ] = DEFAULTS.server.default_voice,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            metavar="ORIGIN",
            help="A web page origin that may call the API from a browser (CORS), e.g. https://app.example.com; "
            "repeat for more, * for any. Default: same origin only.",
            show_default=",".join(DEFAULTS.server.cors_origins) or False,
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Serve on Ray Serve: replicas of the engine (--batch rows each) on this machine's or a cluster's "
            "GPUs, behind Ray's HTTP proxy (the ray extra: " + escape(install_extra("ray")) + ").",
        ),
    ] = False,
    address: Annotated[
        str | None,
        typer.Option(help="--ray: the cluster to join (auto: the one this machine is in; default: a new one)."),
    ] = None,
    replicas: Annotated[int, typer.Option(help=described(DEFAULTS.ray, "replicas", "--ray: "))] = DEFAULTS.ray.replicas,
    autoscale: Annotated[
        str | None, typer.Option(help="--ray: MIN:MAX replicas, scaled on requests in flight (replaces --replicas).")
    ] = None,
    replica_gpus: Annotated[
        float | None, typer.Option(help="--ray: GPUs per replica (default: 1 where this machine sees CUDA, else 0).")
    ] = None,
) -> None:
    """Serve the OpenAI-compatible speech API (POST /v1/audio/speech), voices, /health and /metrics."""

    from ..server import create_app
    from ..server.connections import Server, uvicorn_config
    from ..server.voicenames import parse_voice_map
    from ..tts import TTS

    chosen = batch  # None: not given, decided once the device is known (serve_rows)
    batch = DEFAULTS.server.batch if batch is None else batch
    if not 0 < max_upload_mb <= 1024 or round(max_upload_mb * 2**20) < 1:  # the option's unit, a byte at least
        raise ConfigError(f"--max-upload-mb must be over 0 (a byte at least) and at most 1024, got {max_upload_mb:g}")
    ray_only = {"--address": address, "--autoscale": autoscale, "--replica-gpus": replica_gpus}
    ray_only["--replicas"] = None if replicas == DEFAULTS.ray.replicas else replicas
    given = [name for name, value in ray_only.items() if value is not None]
    if given and not ray:
        raise ConfigError(f"{', '.join(given)}: Ray Serve options: add --ray, or drop them to serve here")
    settings = override(
        DEFAULTS.server,
        {"cors_origins": "--cors-origin"},
        host=host,
        port=port,
        workers=workers,
        batch=batch,
        max_queue=max_queue,
        max_input_chars=max_input_chars,
        max_upload_bytes=round(max_upload_mb * 2**20),
        max_frames=max_frames,
        chunk_frames=chunk_frames,
        first_chunk_frames=first_chunk_frames,
        sample_rate=sample_rate,
        voice_map=parse_voice_map(voice_map) if voice_map is not None else DEFAULTS.server.voice_map,
        default_voice=None if default_voice is None else _option_name("--default-voice", default_voice),
        cors_origins=DEFAULTS.server.cors_origins if cors_origin is None else tuple(cors_origin),
    )
    check_port(host, port)  # before minutes of loading
    if batch and workers != DEFAULTS.server.workers:
        raise ConfigError("--batch N serves N requests from one model instance: give --batch or --workers, not both")
    if ray:
        if (
            workers != DEFAULTS.server.workers
            or cuda_graphs != DEFAULTS.torch.cuda_graphs
            or backend != "torch"
            or assets
        ):
            raise ConfigError(
                "--ray replicas run the torch backend, --batch rows each: drop --workers, --cuda-graphs, --backend "
                "and --assets (scale with --batch and --replicas or --autoscale)"
            )
        fields = dict(model=str(model), voices=voices and str(voices), device=device, precision=precision)
        _serve_on_ray(settings, address, replicas, autoscale, replica_gpus, **fields)
        return
    load_options = dict(
        device=device,
        precision=precision,
        voices_dir=voices,
        backend=backend,
        assets=assets,
        cuda_graphs=cuda_graphs,
        codec_process=codec_process,
    )
    count = 1 if batch else workers
    with err.status(f"loading {count} model instance(s)..."):
        loaded = [TTS.load(model, **load_options)]
        try:
            check_instances_fit(loaded[0], count)
            loaded += [TTS.load(model, **load_options) for _ in range(count - 1)]
        except BaseException:
            for tts in loaded:
                tts.close()
            raise
    instances = loaded
    batch = serve_rows(chosen, batch, workers, loaded[0].backend.device.type)
    if batch:
        _, instances = instances[0].batched(batch)
    first = loaded[0]
    rows = f"{batch} batched rows" if batch else f"{count} worker(s)"
    try:
        err.print(  # what runs, for the operator's log (uvicorn's lines name only the address)
            f"serving {first.checkpoint.name} ({first.backend.description}, {rows}; voices in {first.voices.root})",
            highlight=False,
            soft_wrap=True,
        )
        Server(uvicorn_config(create_app(instances, settings), settings, host, port)).run()
    finally:  # uvicorn returns on Ctrl-C or SIGTERM: end the codec processes with the server
        for tts in loaded:
            tts.close()


def serve_rows(chosen: int | None, batch: int, workers: int, device_type: str) -> int:
    """The batched rows ``audio8 serve`` runs: ``batch`` (``--batch``, else ``AUDIO8_SERVER__BATCH``) when
    ``chosen`` (``--batch`` given) or when it is set; else, on a CUDA device with ``--workers`` not given,
    ``DEFAULTS.server.cuda_batch`` (a GPU serving one utterance at a time is mostly idle: docs/scale-out.md); else 0
    (one utterance at a time per worker)."""
    if chosen is not None or batch or workers != DEFAULTS.server.workers or device_type != "cuda":
        return batch
    return DEFAULTS.server.cuda_batch


def check_instances_fit(tts: TTS, count: int) -> None:
    """ConfigError (``--workers``) when ``count`` instances of ``tts``'s model, each holding about its checkpoint
    files' bytes, are more than the memory of its device (a CUDA device's, else this machine's), before they load."""
    ckpt = tts.checkpoint
    each = ckpt.model_file.stat().st_size + ckpt.codec_file.stat().st_size
    have = tts.backend.memory_bytes()
    if have is not None and count * each > have:
        gb = 2**30
        raise ConfigError(
            f"--workers {count}: {count} model instances need about {count * each / gb:.1f} GB ({each / gb:.2f} GB "
            f"each), more than the {have / gb:.1f} GB of memory of {tts.backend.device_name}: lower --workers (at most "
            f"{max(1, have // each)}), or serve many requests from one model with --batch N"
        )


def _check_fits_here(cluster: RaySettings) -> None:
    """ConfigError when the replicas a new Ray instance on this machine must start (``replicas``, or autoscale's
    minimum) need more CPUs or GPUs than it has: Ray would leave them pending, saying so only in its own log."""
    import torch

    count = cluster.replicas if cluster.autoscale is None else cluster.autoscale[0]
    cpus, gpus = len(os.sched_getaffinity(0)), torch.cuda.device_count()  # the CPUs this process may use
    if count * cluster.cpus > cpus or count * cluster.gpus > gpus:
        raise ConfigError(
            f"{count} replica(s) need {count * cluster.cpus:g} CPUs and {count * cluster.gpus:g} GPUs "
            f"({cluster.cpus:g} and {cluster.gpus:g} each: AUDIO8_RAY__CPUS, --replica-gpus), and the Ray instance of "
            f"this machine has {cpus} CPUs and {gpus} GPUs: lower --replicas or --replica-gpus, or join a cluster "
            "with --address"
        )


def _serve_on_ray(
    server: ServerSettings, address: str | None, replicas: int, autoscale: str | None, gpus: float | None, **fields
) -> None:
    """``serve --ray``: the same app on Ray Serve (:mod:`..server.ray_app`) under ``server``, ``DEFAULTS.ray`` with
    the options (``fields``: the engine's checkpoint, voices, device and precision); raises ConfigError for a bad
    scale or when Ray Serve is not installed, and, for a new Ray instance on this machine (no ``--address`` or
    ``RAY_ADDRESS``, or "local"), before it starts: ConfigError for replicas this machine cannot hold,
    CheckpointError for a local checkpoint that is none, VoiceError for a ``--voice-map`` target or
    ``--default-voice`` that is no voice of it."""
    try:
        from ..server.ray_app import run_on_ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray Serve: {install_extra('ray')}") from None
    scale = None
    if autoscale is not None:
        low, colon, high = autoscale.partition(":")
        if not (colon and low.isdigit() and high.isdigit()):
            raise ConfigError(f"--autoscale takes MIN:MAX replicas, e.g. 1:8; got {autoscale!r}")
        scale = (int(low), int(high))
    if gpus is None:
        import torch

        gpus = 1.0 if fields["device"] != "cpu" and torch.cuda.is_available() else 0.0
    names = {"gpus": "--replica-gpus", "model": "--model", "voices": "--voices", "precision": "--precision"}
    cluster = override(DEFAULTS.ray, names, replicas=replicas, autoscale=scale, gpus=gpus, **fields)
    if (address or os.environ.get("RAY_ADDRESS") or "local") != "local":
        run_on_ray(cluster, server, address)  # a cluster's files and resources are its nodes', not this machine's
        return
    _check_fits_here(cluster)
    if not is_hub_id(cluster.model or DEFAULT_MODEL):  # a local checkpoint is checked here, not in every replica
        from ..checkpoint import load_checkpoint
        from ..server.voicenames import check_voices
        from ..voices import VoiceStore

        fingerprint = load_checkpoint(cluster.model).fingerprint()
        check_voices(VoiceStore(cluster.voices), server.voice_map, server.default_voice, fingerprint)
    run_on_ray(cluster, server, address)


def _option_name(option: str, name: str) -> str:
    """``name`` checked as a voice name (:func:`..voices.check_name`); its VoiceError says the option it came in."""
    from ..voices import check_name

    try:
        return check_name(name)
    except VoiceError as e:
        raise VoiceError(f"{option}: {e}") from None
