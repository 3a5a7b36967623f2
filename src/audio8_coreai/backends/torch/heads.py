"""The KV state of prompt heads kept between prompts: a prompt's first columns (the system turn and a voice's
reference) are the same for every request in one voice, so their state is computed once and copied in after."""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor


class PromptHeads:
    """The KV state (k, v), each [n_layer, 1, n_kv, H, D] for a head of H columns, of the last ``kept`` prompt heads,
    keyed by the head's codes (int64 bytes); the least recently used is dropped first. Not thread-safe: its
    backend's calls are serialised."""

    def __init__(self, kept: int):
        self.kept = kept
        self._state: OrderedDict[bytes, tuple[Tensor, Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._state)

    def keys(self) -> list[bytes]:
        """The kept heads' keys, least recently used first."""
        return list(self._state)

    def take(self, key: bytes) -> tuple[Tensor, Tensor] | None:
        """The state kept for ``key`` (now the most recently used), or None."""
        state = self._state.get(key)
        if state is not None:
            self._state.move_to_end(key)
        return state

    def keep(self, key: bytes, k: Tensor, v: Tensor) -> None:
        """Keep ``k``, ``v`` (the caller's copies) for ``key``, dropping the least recently used beyond ``kept``."""
        self._state[key] = (k, v)
        while len(self._state) > self.kept:
            self._state.popitem(last=False)

    def clear(self) -> None:
        """Drop every kept head: the next prompt computes its head again."""
        self._state.clear()
