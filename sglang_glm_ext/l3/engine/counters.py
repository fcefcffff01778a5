"""The store's monotonic counters (``stats()``), one object that the caller, writer and committer threads add to.

Plain int adds, unlocked: they are diagnostics and a lost add under a thread race is acceptable; they never steer
the data path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Counters"]


@dataclass
class Counters:
    spilled: int = 0          # pages made durable by this store
    spilled_bytes: int = 0    # their payload bytes (page_bytes of their kind)
    spill_accepted: int = 0   # spill() calls that returned True for a page
    dedup: int = 0            # pages accepted without a write (already durable / staged / won by another rank)
    dropped_staging: int = 0  # staging bytes cap or max_inflight reached
    dropped_pool_full: int = 0
    dropped_bad_input: int = 0
    write_errors: int = 0
    index_full: int = 0
    reload_hits: int = 0
    reload_from_staging: int = 0  # of reload_hits: served from a staged page's buffer (not durable yet)
    reload_bytes: int = 0     # payload bytes of reload_hits
    reload_misses: int = 0
    reload_bad_dst: int = 0   # destinations that cannot take the page in place (too small, strided, read-only)
    verify_failures: int = 0
    gc_reclaimed: int = 0
    freed: int = 0
    data_path_errors: int = 0  # unexpected exceptions turned into misses
    # disk index -> reload pages whose read failed there (EIO...): in stats()["per_disk"], not a flat counter
    disk_read_errors: dict = field(default_factory=dict)

    def flat(self) -> dict:
        """The plain counters (``stats()``'s flat keys)."""
        return {k: v for k, v in vars(self).items() if k != "disk_read_errors"}

    def read_error(self, disk: int) -> None:
        self.disk_read_errors[disk] = self.disk_read_errors.get(disk, 0) + 1
