"""Which backend to open, and opening it: the one place that knows the backends by name (the API, the CLI and the
gate call it). The interface they implement is :mod:`.base`, which knows none of them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..checkpoint import Checkpoint
from ..errors import BackendError
from ..precision import resolve_precision
from ..settings import DEFAULTS
from .base import Backend

BACKENDS = ("torch", "coreai")


def check_backend_choice(
    backend: str, device: str = "auto", assets: object = None, cuda_graphs: bool | None = DEFAULTS.torch.cuda_graphs
) -> None:
    """Check a backend choice before anything loads: a known backend, assets exactly for coreai, CUDA graphs
    (``cuda_graphs`` True; None is the default, on where the device is CUDA) only for torch on a CUDA device.
    Raises BackendError saying what to change."""
    from .torch import resolve_device

    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "coreai" and assets is None:
        raise BackendError(
            "the coreai backend runs converted assets: give assets=DIR (--assets), a folder written by audio8 convert"
        )
    if backend != "coreai" and assets is not None:
        raise BackendError(
            "assets (--assets) are run by the coreai backend: add backend='coreai' "
            "(--backend coreai), or drop the assets to use the torch backend"
        )
    if backend == "coreai" and cuda_graphs:
        raise BackendError("CUDA graphs (--cuda-graphs) are a torch-backend option: drop them for coreai")
    if backend == "coreai" and device not in ("auto", "cpu"):  # the runtime picks its compute units (macOS: GPU)
        raise BackendError(f"the device {device} is a torch-backend choice: drop --device (device=) for coreai")
    if cuda_graphs and resolve_device(device).type != "cuda":
        raise BackendError(
            f"CUDA graphs need a CUDA device, not {resolve_device(device)}: drop --cuda-graphs (cuda_graphs=True, "
            "AUDIO8_TORCH__CUDA_GRAPHS=true) or use --device cuda"
        )


def open_backend(
    checkpoint: Checkpoint,
    backend: str = "torch",
    *,
    device: str = "auto",
    precision: str | None = None,
    codec_dtype: str | None = None,
    cuda_graphs: bool | None = DEFAULTS.torch.cuda_graphs,
    assets: object = None,
    prefix_length: Callable[[np.ndarray], int] | None = None,
    codec_process: bool | None = DEFAULTS.torch.codec_process,
) -> Backend:
    """THE backend picker (the API, the CLI and the gate call it): ``torch`` on ``device`` at ``precision`` (None:
    the device's default), its codec at ``codec_dtype``, frames as CUDA graphs with ``cuda_graphs`` (None: when the
    device is CUDA; single frames and batched rows alike, see :mod:`.torch.cudagraphs`), prompt heads
    kept per ``prefix_length``, its codec in a process of its own per ``codec_process`` (None: the default, see
    :class:`.torch.TorchBackend`); or ``coreai`` running the asset folder ``assets`` (a ``precision`` given must be
    theirs).
    Raises BackendError (see :func:`check_backend_choice`; missing, stale or foreign assets), PrecisionError."""
    check_backend_choice(backend, device, assets, cuda_graphs)
    if backend == "coreai":
        from .coreai import CoreAIBackend

        if precision is not None:  # a Core AI precision (PrecisionError naming them), said before the assets load
            precision = resolve_precision(precision, "coreai").name
        chosen = CoreAIBackend(checkpoint, assets)
        if precision is not None and precision != chosen.precision:  # assets run at the one they were made at
            raise BackendError(
                f"these assets were converted at {chosen.precision}, not {precision}: drop --precision {precision} "
                f"(precision=), or convert assets at it (audio8 convert --precision {precision})"
            )
        return chosen
    from .torch import TorchBackend, resolve_device

    if cuda_graphs is None:
        cuda_graphs = resolve_device(device).type == "cuda"
    return TorchBackend(
        checkpoint,
        device,
        precision=precision,
        codec_dtype=codec_dtype,
        frame_mode="graph" if cuda_graphs else "eager",
        prefix_length=prefix_length,
        codec_process=codec_process,
    )
