"""``audio8 wyoming``: the Wyoming protocol server for Home Assistant (text to speech)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..checkpoint import DEFAULT_MODEL
from ..errors import ConfigError
from ..packages import install_extra
from ..settings import DEFAULTS, override
from .app import (
    AssetsOpt,
    BackendOpt,
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

_CHECKPOINTS = " (default: the checkpoint's)"


@app.command()
@friendly
def wyoming(
    host: Annotated[str, typer.Option(help=described(DEFAULTS.wyoming, "host"))] = DEFAULTS.wyoming.host,
    port: Annotated[int, typer.Option(help=described(DEFAULTS.wyoming, "port"))] = DEFAULTS.wyoming.port,
    model: ModelOpt = DEFAULT_MODEL,
    voices: VoicesOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = None,
    cuda_graphs: CudaGraphsOpt = DEFAULTS.torch.cuda_graphs,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    seed: Annotated[
        int | None,
        typer.Option(help=described(DEFAULTS.wyoming, "seed", more=" (a stream: one for all its sentences)")),
    ] = DEFAULTS.wyoming.seed,
    temperature: Annotated[
        float | None, typer.Option(help=described(DEFAULTS.wyoming, "temperature", more=_CHECKPOINTS))
    ] = DEFAULTS.wyoming.temperature,
    top_k: Annotated[
        int | None, typer.Option(help=described(DEFAULTS.wyoming, "top_k", more=_CHECKPOINTS))
    ] = DEFAULTS.wyoming.top_k,
    top_p: Annotated[
        float | None, typer.Option(help=described(DEFAULTS.wyoming, "top_p", more=_CHECKPOINTS))
    ] = DEFAULTS.wyoming.top_p,
    max_frames: Annotated[
        int | None, typer.Option(help=described(DEFAULTS.wyoming, "max_frames"))
    ] = DEFAULTS.wyoming.max_frames,
    max_input_chars: Annotated[
        int, typer.Option(help=described(DEFAULTS.wyoming, "max_input_chars"))
    ] = DEFAULTS.wyoming.max_input_chars,
) -> None:
    """Serve Home Assistant's Wyoming protocol: describe, synthesize and streaming synthesize, 44.1 kHz audio."""
    import asyncio

    try:
        from ..server.wyoming_serve import serve
        from ..server.wyoming_speaker import Speaker
    except ImportError as e:
        raise ConfigError(f"audio8 wyoming needs the wyoming package ({e}): {install_extra('wyoming')}") from e
    from ..tts import TTS

    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    options = dict(host=host, port=port, seed=seed, max_frames=max_frames, max_input_chars=max_input_chars)
    settings = override(DEFAULTS.wyoming, **options, **sampling)
    check_port(host, port)  # before minutes of loading
    with err.status("loading the model..."):
        options = dict(device=device, precision=precision, backend=backend, assets=assets, cuda_graphs=cuda_graphs)
        tts = TTS.load(model, voices_dir=voices, **options)
    err.print(f"Wyoming text to speech on tcp://{host}:{port} (Home Assistant: add the Wyoming integration)")
    asyncio.run(serve(Speaker(tts, settings), host, port))
