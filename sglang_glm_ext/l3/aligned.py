"""Page-aligned host buffers for O_DIRECT transfers, and address helpers for plain buffers.

O_DIRECT needs the memory address, the file offset and the length aligned to the device's block size; an
anonymous mmap is page-aligned (4 KiB, a multiple of every block size we meet), which is why it is used here
instead of a bytearray (whose address is only 16-byte aligned).
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

PAGE = mmap.PAGESIZE


def buffer_address(obj) -> int:
    """Address of the first byte of a C-contiguous buffer-protocol object (or an int address, returned as is)."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    if isinstance(obj, AlignedBuffer):
        return obj.address
    arr = np.frombuffer(obj, dtype=np.uint8) if not isinstance(obj, np.ndarray) else obj
    if arr.size == 0:
        return arr.__array_interface__["data"][0]
    return arr.ctypes.data


def is_aligned(buffer_or_addr, n: int = 4096) -> bool:
    return buffer_address(buffer_or_addr) % n == 0


class AlignedBuffer:
    """``size`` writable bytes at a page-aligned address, valid until ``close()``.

    ``view`` is exactly ``size`` bytes; the mapping behind it is rounded up to whole pages (``capacity``).
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"AlignedBuffer size must be a positive int, got {size!r}")
        self.size = size
        self.capacity = -(-size // PAGE) * PAGE
        self._map = mmap.mmap(-1, self.capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        # The ctypes export is dropped at once so close() can unmap; the address stays valid until then.
        anchor = ctypes.c_char.from_buffer(self._map)
        self.address = ctypes.addressof(anchor)
        del anchor
        self._view = memoryview(self._map)[:size]

    @property
    def view(self) -> memoryview:
        if self._view is None:
            raise ValueError("AlignedBuffer is closed")
        return self._view

    @property
    def closed(self) -> bool:
        return self._view is None

    def __len__(self) -> int:
        return self.size

    def __buffer__(self, flags):  # PEP 688 (3.12+): lets memoryview(buf) work directly
        return self.view

    def close(self) -> None:
        """Unmap. Raises BufferError if a caller still holds a slice of ``view`` (an unmap would leave it dangling)."""
        if self._view is None:
            return
        self._view.release()
        self._view = None
        try:
            self._map.close()
        except BufferError:
            self._view = memoryview(self._map)[: self.size]
            raise

    def __enter__(self) -> "AlignedBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
