"""``audio8 wyoming``: the Wyoming protocol server for Home Assistant (text to speech)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..checkpoint import DEFAULT_MODEL
from ..errors import ConfigError
from ..settings import DEFAULTS
from .app import (
    AssetsOpt,
    BackendOpt,
    CudaGraphsOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    VoicesOpt,
    app,
    check_port,
    err,
    friendly,
)


@app.command()
@friendly
def wyoming(
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = DEFAULTS.server.host,
    port: Annotated[int, typer.Option(help="TCP port (10200: Wyoming's for text to speech).")] = DEFAULTS.wyoming.port,
    model: ModelOpt = DEFAULT_MODEL,
    voices: VoicesOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    cuda_graphs: CudaGraphsOpt = DEFAULTS.torch.cuda_graphs,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of every utterance (default: each draws one; a stream one for all).")
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature (default: the checkpoint's).")] = None,
    top_k: Annotated[int | None, typer.Option(help="Top-k (default: the checkpoint's).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Top-p (default: the checkpoint's).")] = None,
    max_frames: Annotated[int | None, typer.Option(help="Frame cap per utterance (default: the model's).")] = None,
    max_input_chars: Annotated[int, typer.Option(help="Longest text per request.")] = DEFAULTS.server.max_input_chars,
) -> None:
    """Serve Home Assistant's Wyoming protocol: describe, synthesize and streaming synthesize, 44.1 kHz audio."""
    import asyncio

    try:
        from wyoming.server import AsyncTcpServer

        from ..server.wyoming import Speaker, WyomingSettings, serve
    except ImportError as e:
        raise ConfigError(
            f"audio8 wyoming needs the wyoming package: pip install 'audio8-coreai[wyoming]' ({e})"
        ) from e
    from ..request import check_request
    from ..tts import TTS

    if max_input_chars < 1 or (max_frames is not None and max_frames < 1):
        raise ConfigError("--max-input-chars and --max-frames must be >= 1")
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    check_request("a", seed=seed, **sampling)  # the seed and sampling settings, against the publisher's rules
    check_port(host, port)  # before minutes of loading
    settings = WyomingSettings(seed=seed, max_frames=max_frames, max_input_chars=max_input_chars, **sampling)
    with err.status("loading the model..."):
        options = dict(device=device, dtype=dtype, backend=backend, assets=assets, cuda_graphs=cuda_graphs)
        tts = TTS.load(model, voices_dir=voices, **options)
    err.print(f"Wyoming text to speech on tcp://{host}:{port} (Home Assistant: add the Wyoming integration)")
    asyncio.run(serve(Speaker(tts, settings), AsyncTcpServer(host, port)))
