"""Page-aligned host buffers for O_DIRECT transfers, and the views every other module takes of a buffer.

O_DIRECT needs the memory address, the file offset and the length aligned to the device's block size; an
anonymous mmap is page-aligned (4 KiB, a multiple of every block size we meet), which is why it is used here
instead of a bytearray (whose address is only 16-byte aligned).

``byte_view`` (a flat memoryview: checksums, slab I/O) and ``page_array`` (a flat uint8 array over a page's own
memory: the store's copies) are the only places that turn "any buffer" into bytes.
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


def byte_view(buf) -> memoryview:
    """A flat, 1-D unsigned-byte view of ``buf`` (an AlignedBuffer or any C-contiguous buffer); ValueError for a
    strided buffer (its bytes in memory order are not its logical bytes)."""
    view = buf.view if isinstance(buf, AlignedBuffer) else memoryview(buf)
    if not view.c_contiguous:
        raise ValueError("buffer must be C-contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def page_array(obj, *, writable: bool) -> np.ndarray:
    """A flat uint8 array over ``obj``'s OWN memory, in memory order; ValueError/TypeError for anything else.

    A page is a buffer's bytes in memory order. Only a C-contiguous buffer has its memory order equal to its
    logical order, so only such a buffer qualifies, on spill and on reload alike: for a Fortran-ordered or strided
    array numpy's ``reshape(-1)`` returns a copy, and a reload written into that copy would be acknowledged while
    the caller's array stays untouched.
    """
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError("array is not C-contiguous (Fortran order or a strided slice)")
        flat = obj.reshape(-1).view(np.uint8)
    else:
        flat = np.frombuffer(byte_view(obj), dtype=np.uint8)
    if writable and not flat.flags.writeable:
        raise ValueError("buffer is read-only")
    return flat
