"""The host edge of the batched static frame: one bucket's inputs written on the host, copied to the device in one go.

Per bucket of B rows, :class:`Staging` holds host buffers (page-locked on CUDA, so their copies are asynchronous)
whose NumPy views take each call's inputs row by row, and their device twins, the fixed inputs a captured graph
reads (:class:`...model.frame.FrameInputs`, :class:`...model.frame.Prefilled`). Entry r of the bucket is KV row r
of the batch (:meth:`...model.frame.Frame.rows`). :meth:`Staging.load` packs a call's rows and pads the others,
then issues every copy non-blocking on the current stream, ordered before the replay that reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ...config import ModelConfig
from ...model.frame import FrameInputs, Prefilled
from ..base import StepInputs
from .host_edge import input_shapes, pack


class Staging:
    """The fixed inputs of one bucket of ``size`` rows on ``device`` (``dtype``: the model's, for frame-0 logits and
    hidden), with host buffers for them. ``inputs``/``prefilled`` are the device tensors a graph reads; every entry
    starts as padding (see :meth:`load`)."""

    def __init__(self, cfg: ModelConfig, size: int, device: torch.device, dtype: torch.dtype):
        pin = device.type == "cuda"
        self.size, self.last_slot = size, cfg.max_seq_len - 1
        shapes = input_shapes(cfg, size)
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
        self.prefilled = Prefilled(
            first=d["first"],
            logits=torch.zeros(size, cfg.num_semantic + 1, dtype=dtype, device=device),
            hidden=torch.zeros(size, cfg.dim, dtype=dtype, device=device),
        )
        self._upload()

    def load(self, calls: Sequence[tuple[int, StepInputs]], prefilled: Mapping[int, tuple[Tensor, Tensor]]) -> None:
        """Write ``calls`` (KV row, step inputs; rows distinct and below ``size``) into their entries
        (:func:`.host_edge.pack`) and pad every other entry (the last slot, no forcing, no frame 0), then copy to
        the device. A frame-0 call takes ``prefilled[row]`` (its prefill's logits [V+1] and hidden [dim], on the
        device)."""
        h = self.host
        h["pos"].fill(self.last_slot)
        h["use_forced"].fill(0.0)
        h["first"].fill(False)
        pack([x for _, x in calls], [row for row, _ in calls], h, self.last_slot)
        for row, x in calls:
            if x.column is None:
                logits, hidden = prefilled[row]
                self.prefilled.logits[row].copy_(logits)
                self.prefilled.hidden[row].copy_(hidden)
        self._upload()

    def _upload(self) -> None:
        """Copy the host buffers into their device twins (nothing on the CPU: they are the same tensors)."""
        for name, host in self._host.items():
            dev = self._device[name]
            if dev is not host:
                dev.copy_(host, non_blocking=True)
