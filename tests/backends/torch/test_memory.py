"""Memory while weights load (backends/torch/memory.py, quantize.py): the stored pages of converted weights are
handed back, the values stay. Page residency is read from ``/proc/self/pagemap`` (its present bit), exact and
untimed; Linux only."""

from __future__ import annotations

import ctypes
import mmap
import struct
from pathlib import Path

import pytest
import torch

from audio8_coreai.backends.torch.memory import HUGE_PAGE, back_with_huge_pages, release_mapped_pages
from audio8_coreai.backends.torch.quantize import apply_precision
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.model.dualar import DualAR
from audio8_coreai.precision import resolve_precision

pytestmark = pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="reads /proc/self/pagemap (Linux)")

PAGE = mmap.PAGESIZE


def _interior(t: torch.Tensor) -> range:
    """The numbers of the pages wholly inside ``t``'s storage."""
    start, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
    return range(-(-start // PAGE), (start + nbytes) // PAGE)


def _resident(pages: range) -> int:
    """How many of ``pages`` are in this process's page tables now (pagemap bit 63; reading does not fault)."""
    if not pages:
        return 0
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(pages.start * 8)
        entries = struct.unpack(f"{len(pages)}Q", f.read(len(pages) * 8))
    return sum(e >> 63 for e in entries)


def _converted(name: str) -> bool:
    return name.endswith(("wqkv.weight", "wo.weight", "w1.weight", "w2.weight", "w3.weight", "fast_output.weight"))


@pytest.mark.parametrize("pressure", [False, True], ids=["resident", "reclaimed"])
@pytest.mark.parametrize("precision", ["fp16w", "int16"])
def test_converting_a_mapped_checkpoint_keeps_no_stored_linear_resident(tiny_checkpoint, precision, pressure):
    """DualAR.from_state_dict on the mapped checkpoint then apply_precision: every converted linear's stored pages
    are out of the process's RSS afterwards, though the file stays mapped (the state dict is held here, as the
    embedding tables hold it in the backend), so a load never holds the stored weights beside the converted ones;
    the pages the head's rows were copied from stay resident (the check sees pages), and the values are intact.
    ``reclaimed``: the pages of every tensor but the linears dropped before converting, as memory pressure does, so
    the tables' reads fault and the kernel maps the neighbouring pages too (fault-around; this found 3-7 pages of
    the first fast layer's linears left resident)."""
    ckpt = load_checkpoint(tiny_checkpoint)
    state = ckpt.model_state_dict()
    model = DualAR.from_state_dict(ckpt.config, state, torch.float32)
    linears = {name: t for name, t in state.items() if _converted(name)}
    pages = {name: _interior(t) for name, t in linears.items()}
    assert len(linears) == 5 * (ckpt.config.n_layer + ckpt.config.n_fast_layer) + 1
    assert sum(len(p) for p in pages.values()) >= 64  # most of the tiny model's linears span whole pages
    if pressure:
        others = [t for name, t in state.items() if name not in linears]
        release_mapped_pages(others)
        assert sum(_resident(_interior(t)) for t in others) == 0
    apply_precision(model, resolve_precision(precision))
    assert {name: _resident(p) for name, p in pages.items()} == dict.fromkeys(pages, 0)
    cfg = ckpt.config
    head_rows = state["embeddings.weight"][cfg.semantic_begin_id : cfg.semantic_end_id + 1]
    first, nbytes = head_rows.data_ptr(), head_rows.numel() * head_rows.element_size()
    assert _resident(range(first // PAGE, (first + nbytes - 1) // PAGE + 1)) > 0
    from safetensors.torch import load_file

    stored = load_file(tiny_checkpoint / "model.safetensors")
    assert all(torch.equal(t, stored[name]) for name, t in linears.items())  # read back from the file


def test_release_leaves_memory_not_mapped_from_a_file_alone():
    """Heap tensors keep their pages and values (MADV_DONTNEED would zero them)."""
    t = torch.arange(4 * PAGE, dtype=torch.float32)
    before = _resident(_interior(t))
    release_mapped_pages([t])
    assert before > 0 and _resident(_interior(t)) == before
    assert torch.equal(t, torch.arange(4 * PAGE, dtype=torch.float32))


def _smaps_of(address: int) -> dict[str, int]:
    """The kB fields (Rss, AnonHugePages, ...) of the mapping holding ``address`` (``/proc/self/smaps``)."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                lo, hi = (int(a, 16) for a in parts[0].split("-"))
                inside = lo <= address < hi
            elif inside and len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return fields


def test_huge_pages_back_the_wholly_resident_spans_and_nothing_else():
    """An 18 MiB private anonymous mapping whose 4 aligned 2 MiB spans are written: those become huge pages where
    the kernel can (MADV_COLLAPSE, transparent huge pages not off), no page of the rest is populated (RSS
    unchanged), and every value stays."""
    region = mmap.mmap(-1, 9 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(region)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    offset = -(-base // HUGE_PAGE) * HUGE_PAGE - base  # the first aligned span
    written = bytes(range(256)) * (4 * HUGE_PAGE // 256)  # 4 spans of 2 MiB
    view[offset : offset + len(written)] = written
    pages = range(base // PAGE, (base + 9 * HUGE_PAGE) // PAGE)
    resident, huge = _resident(pages), _smaps_of(base)["AnonHugePages"]
    collapsed = back_with_huge_pages()
    assert bytes(view[offset : offset + len(written)]) == written
    assert resident == len(written) // PAGE and _resident(pages) == resident  # nothing populated that was not
    if collapsed:  # a kernel with MADV_COLLAPSE and huge pages on (the mapping may have merged with a neighbour)
        assert _smaps_of(base)["AnonHugePages"] - huge >= 4 * HUGE_PAGE // 1024
    view.release()
    region.close()
