"""Hugepage sizes and their names: units, the sizes SGLang accepts, where the kernel keeps each size's pool, how
messages, sysfs, the kernel command line and the hugetlb cgroup spell a size, and the plugin's hugepage errors.
Pure (standard library only); ``capacity.py`` re-exports every name, where callers read them.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3

# SGLang 0.5.23 mmap_allocator.alloc_mmap: the spellings it accepts after .strip().upper(), and their page size.
SGLANG_SIZES = {"2MB": 2 * MIB, "1GB": GIB}
SYS_POOLS = "sys/kernel/mm/hugepages"
SYS_NODES = "sys/devices/system/node"
CGROUP_MOUNT = "sys/fs/cgroup"


class HugepageError(RuntimeError):
    """Base of the plugin's hugepage errors; not an OSError, so SGLang's `except OSError` fallbacks never eat it."""


class HugepageConfigError(HugepageError, ValueError):
    """A hugepage setting (env var value, host-pool allocator) that cannot give a hugepage-backed pool."""


class HugepageCapacityError(HugepageError):
    """Not enough hugepages of the selected size for what is about to be allocated."""


class HugepageAllocError(HugepageError):
    """The MAP_HUGETLB mapping itself failed, or came back without all of its pages."""


def parse_size(raw: str | None, *, env_name: str = "SGLANG_HUGEPAGE_SIZE") -> int | None:
    """Page bytes for an SGLANG_HUGEPAGE_SIZE value (None when unset or blank); raises on a value SGLang ignores."""
    value = (raw or "").strip().upper()
    if not value:
        return None
    if value in SGLANG_SIZES:
        return SGLANG_SIZES[value]
    raise HugepageConfigError(
        f"{env_name}={raw!r} is not a hugepage size SGLang 0.5.23 knows (with it SGLang silently allocates the "
        f"host KV pool from ordinary pages): set {env_name} to {' or '.join(SGLANG_SIZES)} (case-insensitive), "
        "or unset it"
    )


# ---- naming ----

def size_label(page_bytes: int) -> str:
    """'2 MB', '1 GB', '64 kB': how the messages name a page size."""
    if page_bytes % GIB == 0:
        return f"{page_bytes // GIB} GB"
    if page_bytes % MIB == 0:
        return f"{page_bytes // MIB} MB"
    return f"{page_bytes // KIB} kB"


def pool_dir_name(page_bytes: int) -> str:
    return f"hugepages-{page_bytes // KIB}kB"


def cmdline_size(page_bytes: int) -> str:
    """The kernel parameter spelling (`hugepagesz=2M`, `hugepagesz=1G`)."""
    if page_bytes % GIB == 0:
        return f"{page_bytes // GIB}G"
    if page_bytes % MIB == 0:
        return f"{page_bytes // MIB}M"
    return f"{page_bytes // KIB}K"


def cgroup_size_name(page_bytes: int) -> str:
    """The hugetlb cgroup file infix (kernel `memfmt`: 2MB, 1GB, 64KB)."""
    if page_bytes >= GIB:
        return f"{page_bytes // GIB}GB"
    if page_bytes >= MIB:
        return f"{page_bytes // MIB}MB"
    return f"{page_bytes // KIB}KB"


def gib(nbytes: int) -> str:
    """Bytes for a message: GiB from 1 GiB up, MiB below (a few test pages must not read '0.0 GiB')."""
    if abs(nbytes) >= GIB:
        return f"{nbytes / GIB:.1f} GiB"
    return f"{nbytes / MIB:.1f} MiB"


def pages_for(nbytes: int, page_bytes: int) -> int:
    """Pages an mmap of `nbytes` takes: SGLang rounds every mapping up to whole pages."""
    return -(-max(nbytes, 0) // page_bytes)
