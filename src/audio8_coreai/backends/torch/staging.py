"""The host edge of the batched static frame: one bucket's inputs written on the host, copied to the device in one go.

Per bucket of B rows, :class:`Staging` holds host buffers (page-locked on CUDA, so their copies are asynchronous)
whose NumPy views take each call's inputs row by row, and their device twins, the fixed inputs a captured graph
reads (:class:`...model.frame.FrameInputs`, :class:`...model.frame.RowsInputs`). Entry r of the bucket is KV row r
of the batch (:meth:`...model.frame.Frame.rows`). :meth:`Staging.load` writes a call's rows and pads the others,
then issues every copy non-blocking on the current stream, ordered before the replay that reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ...config import ModelConfig
from ...model.frame import FrameInputs, RowsInputs
from ..base import StepInputs


class Staging:
    """The fixed inputs of one bucket of ``size`` rows on ``device`` (``dtype``: the model's, for frame-0 logits and
    hidden), with host buffers for them. ``inputs``/``rows`` are the device tensors a graph reads; every entry starts
    as padding (see :meth:`load`)."""

    def __init__(self, cfg: ModelConfig, size: int, device: torch.device, dtype: torch.dtype):
        c, pin = cfg.num_codebooks, device.type == "cuda"
        shapes = {
            "noise_slow": ((size, 2, cfg.num_semantic + 1), torch.float32),
            "window": ((size, cfg.ras_window_size), torch.int64),
            "noise_fast": ((size, c - 1, cfg.codebook_size), torch.float32),
            "forced": ((size, 1 + c), torch.int64),
            "use_forced": ((size,), torch.float32),
            "column": ((size, 1 + c, 1), torch.int64),
            "pos": ((size,), torch.int64),
            "first": ((size,), torch.bool),
        }
        self.size, self.last_slot = size, cfg.max_seq_len - 1
        self._host = {k: torch.zeros(shape, dtype=dt, pin_memory=pin) for k, (shape, dt) in shapes.items()}
        self.host = {k: t.numpy() for k, t in self._host.items()}  # views: writing them writes the buffers
        self.host["noise_slow"].fill(0.5)  # padding draws from finite noise
        self.host["noise_fast"].fill(0.5)
        self.host["pos"].fill(self.last_slot)
        same = device.type == "cpu"
        self._device = {k: t if same else torch.empty_like(t, device=device) for k, t in self._host.items()}
        d = self._device
        self.inputs = FrameInputs(
            d["noise_slow"], d["window"], d["noise_fast"], d["forced"], d["use_forced"], d["column"], d["pos"]
        )
        self.rows = RowsInputs(
            first=d["first"],
            logits=torch.zeros(size, cfg.num_semantic + 1, dtype=dtype, device=device),
            hidden=torch.zeros(size, cfg.dim, dtype=dtype, device=device),
        )
        self._upload()

    def load(self, calls: Sequence[tuple[int, StepInputs]], prefilled: Mapping[int, tuple[Tensor, Tensor]]) -> None:
        """Write ``calls`` (KV row, step inputs; rows distinct and below ``size``) into their entries and pad every
        other entry (the last slot, no forcing, no frame 0), then copy to the device.

        A frame-0 call (no column) steps at the last slot too and takes ``prefilled[row]`` (its prefill's logits
        [V+1] and hidden [dim], on the device) instead; a row whose step is dropped writes only that slot, which no
        row attends before writing it itself (:meth:`...model.frame.Frame.rows`)."""
        h = self.host
        h["pos"].fill(self.last_slot)
        h["use_forced"].fill(0.0)
        h["first"].fill(False)
        for row, x in calls:
            h["noise_slow"][row] = x.noise_slow
            h["noise_fast"][row] = x.noise_fast
            h["window"][row] = x.window
            if x.forced is not None:
                h["forced"][row] = x.forced
                h["use_forced"][row] = 1.0
            if x.column is None:
                h["first"][row] = True
                logits, hidden = prefilled[row]
                self.rows.logits[row].copy_(logits)
                self.rows.hidden[row].copy_(hidden)
            else:
                h["column"][row, :, 0] = x.column
                h["pos"][row] = x.pos
        self._upload()

    def _upload(self) -> None:
        """Copy the host buffers into their device twins (nothing on the CPU: they are the same tensors)."""
        for name, host in self._host.items():
            dev = self._device[name]
            if dev is not host:
                dev.copy_(host, non_blocking=True)
