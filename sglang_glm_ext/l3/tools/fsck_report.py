"""What ``l3 fsck`` found (fsck.py): the counts per category, the truncated slabs, the deployments the index holds,
the index file's check; its exit code, its one-line result, its text and JSON forms."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from . import exit_codes

__all__ = ["FsckReport"]


@dataclass
class FsckReport:
    deployment_id: str
    live: int = 0
    corrupt: int = 0
    orphan_index: int = 0
    past_end: int = 0
    orphan_slot: int = 0
    unknown_version: int = 0
    old_version: int = 0
    old_version_slabs: int = 0
    empty: int = 0
    damaged_index: int = 0
    slabs_scanned: int = 0
    repaired: int = 0  # index entries --repair deleted (errors and old_version ones)
    repaired_errors: int = 0  # of them, corrupt / orphan_index / past_end ones
    repair: bool = False
    # One dict per slab shorter than its sidecar says (SlabInfo.as_dict + entries_past_end: the slots its index
    # entries name past the end, and restored: whether --repair gave the file its size back).
    truncated_slabs: list = field(default_factory=list)
    # Every deployment the index holds: {"name" (None: nothing on this node names it), "tag", "entries"}.
    deployments: list = field(default_factory=list)
    deployment_missing: bool = False  # this deployment has no entries and no slabs while the index holds others
    # The index file's check at this open (engine/index_check.py): {"action": "verified" | "new" | "in_use" (a live
    # server opened it first) | "damaged" (left as it is) | "salvaged" | "reset", "problems", "kept" (salvaged) or
    # "salvageable" (damaged), "claimed", "moved_to"}; {} without an index.
    index_check: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def index_repaired(self) -> bool:
        return self.index_check.get("action") in ("salvaged", "reset")

    @property
    def needs_repair(self) -> int:
        """Index entries that are errors (each one a page that cannot be served)."""
        return self.corrupt + self.orphan_index + self.past_end

    @property
    def slots_lost(self) -> int:
        return sum(t["slots_lost"] for t in self.truncated_slabs)

    @property
    def errors_left(self) -> int:
        entries = self.needs_repair - (self.repaired_errors if self.repair else 0)
        short = sum(1 for t in self.truncated_slabs if not t["restored"])
        return max(0, entries) + short + (1 if self.damaged_index else 0)

    @property
    def exit_code(self) -> int:
        if self.deployment_missing:
            return exit_codes.USAGE
        if self.errors_left:
            return exit_codes.LEFT
        if self.needs_repair or self.truncated_slabs or self.index_repaired:
            return exit_codes.REPAIRED  # errors were found and errors_left is 0: --repair mended them all
        return exit_codes.CLEAN

    @property
    def result(self) -> str:
        code = self.exit_code
        if code == exit_codes.USAGE:
            return (f"deployment {self.deployment_id!r} not found: nothing of it on this node (config error: a "
                    f"deployment_id typo?)")
        if code == exit_codes.LEFT:
            if self.repair:
                return "ERRORS LEFT after --repair (see above)"
            if self.index_check.get("action") == "damaged":
                return "ERRORS FOUND (stop this node's servers and run with --repair)"
            return "ERRORS FOUND (run with --repair; safe next to live servers)"
        return {exit_codes.REPAIRED: "errors found and repaired", exit_codes.CLEAN: "clean"}[code]

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(exit_code=self.exit_code, result=self.result, slots_lost=self.slots_lost,
                 errors_left=self.errors_left)
        return d

    def render(self) -> str:
        lines = [f"L3 fsck deployment={self.deployment_id} slabs={self.slabs_scanned}",
                 f"  live={self.live} corrupt={self.corrupt} orphan_index={self.orphan_index} "
                 f"past_end={self.past_end} orphan_slot={self.orphan_slot} (free) "
                 f"unknown_version={self.unknown_version} old_version={self.old_version} "
                 f"old_version_slabs={self.old_version_slabs} empty={self.empty} damaged_index={self.damaged_index}"
                 + (f" truncated_slabs={len(self.truncated_slabs)} (slots lost: {self.slots_lost})"
                    if self.truncated_slabs else "")]
        if self.repair:
            restored = sum(1 for t in self.truncated_slabs if t["restored"])
            lines.append(f"  repaired: {self.repaired} index entries deleted ({self.repaired_errors} errors, "
                         f"{self.repaired - self.repaired_errors} old-format), {restored} slab size(s) restored"
                         + (f", the index file replaced ({self.index_check['action']})" if self.index_repaired else "")
                         + "; no blob or sidecar written")
        lines += [f"  - {p}" for p in self.problems]
        lines.append(f"  result: {self.result}")
        return "\n".join(lines)
