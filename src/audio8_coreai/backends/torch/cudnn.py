"""cuDNN's TF32 convolutions for one codec call on CUDA: the codec's ``tf32`` form (``codec_dtype="tf32"``: fp32
weights and activations, the convolutions' products in TF32, as PyTorch runs them by default on a GPU), with the
encoder always in fp32 (its codes are a voice's).

cuDNN's switch (``torch.backends.cudnn.allow_tf32``) is the process's, read as each convolution is launched, so every
codec call (decode or encode) sets it to its own form under one lock (:func:`convolutions`): a TF32 decode never
overlaps an fp32 one or an encode, whatever threads and backends they run on. The frame's products are cuBLAS's,
under a switch of their own that stays off at fp32.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_SWITCH = threading.Lock()


@contextmanager
def convolutions(tf32: bool) -> Iterator[None]:
    """The block's cuDNN convolutions in TF32 (``tf32``) or fp32, under the process's one lock; the switch is put
    back after (also when the block raises)."""
    with _SWITCH:
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = tf32
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32 = before
