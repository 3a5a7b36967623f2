"""The memory of a load: freed heap and the resident pages of a mapped checkpoint's tensors handed back once they have
been converted (so a load never holds the stored weights beside their converted copies), and the converted weights
backed by huge pages (a frame streams them all: with 4 KiB pages it also walks about 200,000 page-table entries)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
import threading
from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor

from ..base import machine_memory_bytes


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:  # pragma: no cover - no C library by that name
        return None


_LIBC = _libc()
if _LIBC is not None:  # mmap's pointer result and arguments, for make_resident
    _LIBC.mmap.restype = ctypes.c_void_p
    _LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; a no-op elsewhere): a load frees many
    mid-sized weight copies that would otherwise stay in the process's RSS."""
    try:
        _LIBC.malloc_trim(0)
    except AttributeError:  # pragma: no cover - not glibc
        pass


HUGE_PAGE = 2**21  # x86-64's and arm64's transparent huge page: 2 MiB
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # Linux's advice numbers (MADV_COLLAPSE: Linux 6.1)


def back_with_huge_pages() -> int:
    """Back this process's anonymous memory whose pages are all resident, 2 MiB span by span (the weights a load has
    converted, the KV cache), with transparent huge pages, now: ``madvise(MADV_HUGEPAGE)`` then ``MADV_COLLAPSE``
    on each such span. Values and RSS are unchanged (a span with a page not present, per ``/proc/self/pagemap``, is
    left alone); the frame's weight reads walk 512x fewer page-table entries (docs/speed.md: a few % to 10 % a frame
    on the CPU). Returns the bytes collapsed; 0 where the kernel lacks ``MADV_COLLAPSE`` or transparent huge pages
    are off (``never``), and off Linux."""
    if not sys.platform.startswith("linux") or _LIBC is None:
        return 0
    collapsed = 0
    try:
        pagemap = open("/proc/self/pagemap", "rb", buffering=0)
    except OSError:
        return 0
    with pagemap:
        for start, end in _huge_page_spans():
            pagemap.seek(start // mmap.PAGESIZE * 8)
            entries = np.frombuffer(pagemap.read((end - start) // mmap.PAGESIZE * 8), np.uint64)
            present = (entries >> np.uint64(63)).astype(bool)  # bit 63: the page is in memory
            for first in range(0, len(present), HUGE_PAGE // mmap.PAGESIZE):
                if present[first : first + HUGE_PAGE // mmap.PAGESIZE].all():
                    addr = ctypes.c_void_p(start + first * mmap.PAGESIZE)
                    length = ctypes.c_size_t(HUGE_PAGE)
                    if _LIBC.madvise(addr, length, _MADV_HUGEPAGE) or _LIBC.madvise(addr, length, _MADV_COLLAPSE):
                        continue
                    collapsed += HUGE_PAGE
    return collapsed


def back_with_huge_pages_soon() -> threading.Thread:
    """:func:`back_with_huge_pages` on a thread of its own (the madvise calls release the GIL), so a load returns
    at once and frames speed up when it ends (about 2.5 s for the 0.6b's weights); the thread is returned."""
    thread = threading.Thread(target=back_with_huge_pages, name="audio8-huge-pages", daemon=True)
    thread.start()
    return thread


def _huge_page_spans() -> list[tuple[int, int]]:
    """(start, end) of the whole 2 MiB spans of this process's private anonymous read-write mappings and its
    ``[heap]`` (``/proc/self/maps``; not files, not the ``[stack]``)."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if fields[1] == "rw-p" and (len(fields) == 5 or fields[5] == "[heap]"):
                lo, hi = (int(a, 16) for a in fields[0].split("-"))
                start, end = -(-lo // HUGE_PAGE) * HUGE_PAGE, hi // HUGE_PAGE * HUGE_PAGE
                if end > start:
                    spans.append((start, end))
    return spans


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


_PROT_RW, _MAP_FIXED_ANONYMOUS = 0x3, 0x02 | 0x20 | 0x10  # PROT_READ|WRITE; MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED


def make_resident(t: Tensor, first_row: int = 0, end_row: int | None = None) -> int:
    """Move rows ``first_row:end_row`` of a 2-D tensor read in place from a memory-mapped file (an embedding table
    of a mapped checkpoint) into anonymous memory at the same addresses, values and tensor unchanged: the pages
    holding them are copied out, replaced by anonymous pages (``mmap`` ``MAP_FIXED``) and filled again, so they
    are never dropped and faulted in from disk again under memory pressure (a frame's lookups would then wait on
    the disk). Edge pages shared with neighbouring rows or tensors move too, with their bytes. Returns the bytes
    moved; 0 where the rows are not in a private file mapping (already anonymous: a heap tensor) and off Linux."""
    if not sys.platform.startswith("linux") or _LIBC is None:
        return 0
    end_row = t.shape[0] if end_row is None else end_row
    row_bytes = t.stride(0) * t.element_size()
    page = mmap.PAGESIZE
    lo = (t.data_ptr() + first_row * row_bytes) // page * page
    hi = -(-(t.data_ptr() + end_row * row_bytes) // page) * page
    if hi <= lo or not _private_and_from_a_file(lo, hi):
        return 0
    data = ctypes.string_at(lo, hi - lo)  # the pages' bytes, read from the file
    if _LIBC.mmap(lo, hi - lo, _PROT_RW, _MAP_FIXED_ANONYMOUS, -1, 0) != lo:  # pragma: no cover - out of memory
        raise MemoryError(f"could not map {hi - lo} bytes of anonymous memory for an embedding table")
    ctypes.memmove(lo, data, hi - lo)
    return hi - lo


def _private_and_from_a_file(lo: int, hi: int) -> bool:
    """Whether ``[lo, hi)`` lies wholly in private mappings (``/proc/self/maps``), one of them at least of a file
    (a table's pages already moved, or a neighbour's, are private anonymous pieces beside it)."""
    covered, from_file = lo, False
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if end <= covered or start >= hi:
                continue
            if start > covered or fields[1][3] != "p":  # a gap, or a shared mapping
                return False
            from_file |= len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/")
            covered = end
            if covered >= hi:
                return from_file
    return False


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory of ``device`` in bytes: a CUDA device's total, else this machine's physical memory (``sysconf``);
    None where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return machine_memory_bytes()
