"""Hand memory back to the OS while weights load: freed heap, and the resident pages of a mapped checkpoint's
tensors once they have been converted (so a load never holds the stored weights beside their converted copies)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from collections.abc import Iterable

import torch
from torch import Tensor


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:  # pragma: no cover - no C library by that name
        return None


_LIBC = _libc()


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; a no-op elsewhere): a load frees many
    mid-sized weight copies that would otherwise stay in the process's RSS."""
    try:
        _LIBC.malloc_trim(0)
    except AttributeError:  # pragma: no cover - not glibc
        pass


def _private_file_mappings() -> list[tuple[int, int]]:
    """(start, end) addresses of this process's private mappings of files (``/proc/self/maps``; Linux)."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[1][3] == "p" and fields[4] != "0" and fields[5].startswith("/"):
                start, end = fields[0].split("-")
                spans.append((int(start, 16), int(end, 16)))
    return spans


def release_mapped_pages(tensors: Iterable[Tensor]) -> None:
    """Drop from this process's RSS the pages wholly inside each tensor's storage, where that storage lies in a
    private mapping of a file (a memory-mapped checkpoint: ``safe_open``, ``torch.load(mmap=True)``):
    ``madvise(MADV_DONTNEED)``. Values are kept: a later read faults a page in again from the file (the same bytes,
    since loaded weights are never written in place). Storage not mapped from a file (the heap) is left alone, and
    so are pages shared with a neighbouring tensor. Linux only; a no-op elsewhere or where the call fails.

    Call it on stored tensors a converted copy has replaced: otherwise their pages, touched by the conversion, stay
    resident for as long as anything else keeps the file mapped (the embedding tables, the codec's other tensors).
    """
    if not sys.platform.startswith("linux") or _LIBC is None:
        return
    spans = _private_file_mappings()
    page = mmap.PAGESIZE
    for t in tensors:
        storage = t.untyped_storage()
        lo = -(-storage.data_ptr() // page) * page
        hi = (storage.data_ptr() + storage.nbytes()) // page * page
        if hi > lo and any(start <= lo and hi <= end for start, end in spans):
            _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED)


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory of ``device`` in bytes: a CUDA device's total, else this machine's physical memory (``sysconf``);
    None where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no sysconf names (not POSIX)
        return None
