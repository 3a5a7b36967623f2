"""What a CUDA graph capture refuses, as a dispatch mode the CPU tests run the graph-mode frame under
(tests/backends/torch/test_capture_safety.py, tests/backends/torch/test_fused.py), and the frame inputs they feed it."""

from __future__ import annotations

import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from audio8_coreai.config import SamplingParams
from audio8_coreai.model.frame import FrameInputs

aten = torch.ops.aten

# What a CUDA graph capture refuses: a host tensor lifted onto the device, a device value read on the host, an
# output whose size depends on values.
REFUSED = {
    aten.lift_fresh,
    aten.lift_fresh_copy,
    aten._local_scalar_dense,
    aten.item,
    aten.is_nonzero,
    aten.equal,
    aten.nonzero,
    aten.nonzero_static,
    aten.masked_select,
    aten._assert_async,
    aten.unique_dim,
    aten._unique2,
}
INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


class RefuseUncapturable(TorchDispatchMode):
    """Raises AssertionError on every op a CUDA graph capture refuses (see :data:`REFUSED`), and on indexing by a
    boolean tensor (a hidden ``nonzero``); ``ops`` counts the ops seen."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if func.overloadpacket in REFUSED:
            raise AssertionError(f"{func} inside the captured frame: a CUDA graph capture refuses it")
        if func.overloadpacket in INDEXING:
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
                raise AssertionError(f"{func} by a boolean mask inside the captured frame (a hidden nonzero)")
        return func(*args, **(kwargs or {}))


SETTINGS = {"sampled": SamplingParams(temperature=0.7, top_k=20, top_p=0.8), "greedy": SamplingParams(do_sample=False)}


def capture_inputs(cfg, batch: int, pos: torch.Tensor, forced: bool, device: str = "cpu") -> FrameInputs:
    """Inputs for ``batch`` utterances at ``pos``, made outside the mode (as the runners copy them in), on
    ``device``."""
    gen = torch.Generator().manual_seed(0)
    c = cfg.num_codebooks
    inputs = FrameInputs(
        noise_slow=torch.rand(batch, 2, cfg.num_semantic + 1, generator=gen).clamp(min=1e-6),
        window=torch.full((batch, cfg.ras_window_size), cfg.semantic_begin_id, dtype=torch.long),
        noise_fast=torch.rand(batch, c - 1, cfg.codebook_size, generator=gen).clamp(min=1e-6),
        forced=torch.ones(batch, 1 + c, dtype=torch.long),
        use_forced=torch.full((batch,), float(forced)),
        column=torch.ones(batch, 1 + c, 1, dtype=torch.long),
        pos=pos,
    )
    tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs) if f.name != "rows"}
    return FrameInputs(**{name: t.to(device) for name, t in tensors.items()})
