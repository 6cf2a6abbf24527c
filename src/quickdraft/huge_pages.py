"""Packed weights on 2 MiB pages (Linux transparent huge pages, asked for with madvise).

A 1-row step streams every packed weight once. On 4 KiB pages the embedded target's 25 MB span
~6,400 pages, more than the second-level TLB maps (Zen 4: 3,072 entries), so each step also walks
the page tables; on 2 MiB pages they span 13. Measured on the embedded pair (Zen 4, the demo's
prompt, one engine per process): plain decoding +16% at one thread and +23% at two, the demo's
speculation +7-8% (BENCHMARKS.md, round 44). Most distributions leave transparent huge pages to programs that ask
(``madvise`` mode), and torch's allocator does not ask, so the weights are copied into a mapping
that does. Only where the page is served changes: the bytes, and so every output, are the same.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line, as torch's allocator places them
MIN_BYTES = 1 << 20  # below this the tensors fit a few 4 KiB TLB entries' worth of pages anyway
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def transparent_huge_pages() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise`` or ``never``), None where it
    has none (not Linux, or a kernel built without them)."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def huge_pages_available() -> bool:
    """Whether packed weights go on huge pages: offered by the kernel, and not refused with
    ``QUICKDRAFT_HUGE_PAGES=0``."""
    if os.environ.get("QUICKDRAFT_HUGE_PAGES", "1") == "0":
        return False
    return transparent_huge_pages() in ("always", "madvise") and hasattr(mmap, "MADV_HUGEPAGE")


def on_huge_pages(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors`` (contiguous CPU tensors) side by side in one anonymous mapping advised
    for huge pages before it is touched, each 64-byte aligned; the tensors themselves where huge
    pages are not offered or they hold less than ``MIN_BYTES`` together. The mapping lives as long
    as any of the copies."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    if sum(sizes) < MIN_BYTES or not huge_pages_available():
        return list(tensors)
    if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        raise ValueError("on_huge_pages takes contiguous CPU tensors")
    spans = [-(-size // ALIGN) * ALIGN for size in sizes]  # each size up to whole cache lines
    try:
        memory, start = _advised_mapping(sum(spans))
    except OSError as error:  # no address space or memory for the mapping: torch's pages serve as before
        log.warning("packed weights stay on small pages: mapping %d bytes failed (%s)", sum(sizes), error)
        return list(tensors)
    copies, offset = [], start
    for tensor, size, span in zip(tensors, sizes, spans, strict=True):
        copy = memory[offset:offset + size].view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        copies.append(copy)
        offset += span
    return copies


def _advised_mapping(span: int) -> tuple[torch.Tensor, int]:
    """A new anonymous mapping of at least ``span`` bytes from a 2 MiB boundary, advised for huge
    pages before it is touched, as a uint8 tensor (which keeps the mapping alive), and that boundary's offset."""
    length = -(-span // HUGE_PAGE) * HUGE_PAGE
    mapping = mmap.mmap(-1, length + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -memory.data_ptr() % HUGE_PAGE  # mmap gives 4 KiB alignment; huge pages need 2 MiB
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, start, length)
    except OSError as error:  # e.g. a seccomp filter: the tensors still work on small pages
        log.debug("madvise(MADV_HUGEPAGE) refused: %s", error)
    return memory, start


def huge_page_bytes(tensor: torch.Tensor) -> int:
    """How many bytes of the mapping holding ``tensor`` are on huge pages (``AnonHugePages`` in
    /proc/self/smaps); 0 where that cannot be read."""
    address = tensor.data_ptr()
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    inside = False
    for line in lines:
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0
