"""``l3 fsck``: check that the shared index and the slabs of one deployment agree.

Categories (counted per slab and in total):

* live            index entry -> slot whose header names exactly that page and whose payload checksum matches
* corrupt         index entry -> slot whose header names the page but the payload checksum (or length) fails
* orphan_index    index entry -> slot that does not hold that page (other page, empty, bad header, out of range,
                  slab missing); serving it would be a miss, never bytes, but it wastes the entry
* past_end        index entry -> slot past the end of a truncated slab (the file is shorter than its sidecar says):
                  the page is gone. Each truncated slab is reported with its expected and actual size, the slots
                  lost and the slots its entries name (``truncated_slabs``)
* orphan_slot     slot with a valid header that no index entry points at. Already free: the index is the only record
                  of which slots are taken, so the owner hands such a slot out again (a slot written and not yet
                  committed by a live server looks the same, which is why fsck never touches one)
* unknown_version header written by a format version this build does not know (a newer server's blob: a miss
                  here, not corruption, never dropped; see l3_format.md)
* old_version     a blob of an earlier format (v1: header in front of the payload). This build never serves one;
                  a ``load`` cold start drops the entries of an old-format slab, ``--repair`` drops the entries
                  that name one. Not corruption: the exit code ignores it
* old_version_slabs  slabs whose sidecar says an earlier format (the previous owner was a v1 build): a
                  ``load`` cold start keeps none of their entries; not corruption (the exit code ignores it)
* empty           never-written slots
* damaged_index   the index file itself is damaged (bit rot, a torn or truncated file). With no server of the node
                  running, fsck proves the file as a server's first open does (engine/index_check.py,
                  ``index.check``) before mapping it: a damaged file is reported with the check's findings and what
                  a salvage would keep, and those entries are still checked against the slabs (read with pread,
                  never mapped); nothing is changed. With servers running, the first of them proved the file; a
                  page damaged since shows as keys out of order or values that are not entries in the deployment's
                  range, every entry still checked (the scan walks past damage)

Kinds are named (target_kv, index_k, draft_kv, draft_index_k). The report lists every deployment the index holds
(``deployments``); a config whose deployment has no entries and no slabs while the index holds others is a
config error (a ``deployment_id`` typo), not "clean".

``--repair`` changes exactly this, and is safe next to live servers:

* it deletes the index entries of corrupt, orphan_index, past_end and old_version pages, each only if it is still
  the very entry the scan judged (same location and last access: a live server's newer commit of the page, even
  into the same slot, is never deleted). Their slots are then free: at the owner's next open, or, for a live
  owner, when its GC reaches them (its conditional delete finds the entry gone and frees the slot);
* it restores a truncated slab's size (``ftruncate`` back to what its sidecar says; the regained slots read as
  empty), only under the slab's own lock: a slab a live server holds is left to it (its next open restores the
  size), and the result says so;
* a damaged index file (damaged_index) is repaired as a server's start would (``index.on_damage``): moved aside
  (``data.mdb.damaged-<utc>-<pid>``) and replaced by an index of every entry that can be proven. Only where no
  process of the node has the index open (LMDB's own lock says so): with servers running it is left to them (stop
  them, then run --repair or start one).

Nothing else is written: no blob, no sidecar. Unreferenced blobs (orphan_slot) need nothing: they are free.

Exit status (``fsck_main``, as e2fsck's, see exit_codes.py): 0 clean; 1 errors found and all repaired; 4 errors left
(no --repair, a slab a live server holds, a damaged index file with no --repair or with servers running); 8
operational error (the index or a slab cannot be opened or read); 16 usage or config error (including a
deployment_id that names nothing while the index holds other deployments). The checks, one function each:
fsck_checks.py; the report: fsck_report.py; progress of a long run on stderr (not with --json): progress.py.
"""

from __future__ import annotations

import argparse
import json
import sys

import lmdb

from ..config import L3Config, L3ConfigError
from ..engine.index import IndexDamagedError, deployment_tag
from . import exit_codes, fsck_checks as checks
from .fsck_report import FsckReport
from .progress import Progress

__all__ = ["FsckReport", "fsck", "fsck_main"]


def fsck(config: L3Config, *, repair: bool = False, headers_only: bool = False, max_problems: int = 50,
         progress: "Progress | None" = None) -> FsckReport:
    """Scan every index entry of ``config.deployment_id`` and every slab of its ranks, one check after the other
    (fsck_checks.py). See the module docstring. ``progress``: where a long run says how far it is (none by
    default)."""
    s = checks.Scan(config, FsckReport(config.deployment_id, repair=repair), deployment_tag(config.deployment_id),
                    repair=repair, headers_only=headers_only, max_problems=max_problems,
                    progress=progress or Progress.off())
    checks.open_index(s)
    try:
        checks.read_entries(s)
        checks.check_entries(s)
        checks.check_slots(s)
        if repair and s.to_drop:
            checks.repair_entries(s)
        checks.report_truncated(s)
        checks.list_deployments(s)
    finally:
        s.progress.finish()
        if s.idx is not None:
            s.idx.close()
    s.rep.problems = s.slab_lines + s.rep.problems
    return s.rep


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="sglang-glm-ext l3 fsck", description=__doc__.split("\n")[0],
                                          epilog=exit_codes.EPILOG)
    p.add_argument("config", help="L3 config (TOML or JSON)")
    p.add_argument("--repair", action="store_true",
                   help="delete the index entries of corrupt, orphaned, past-the-end and old-format pages (only the "
                        "very entries judged) and restore truncated slabs' size where no server holds them; safe "
                        "next to live servers; no blob is written. A damaged index file is moved aside and "
                        "replaced by the entries that can be proven (index.on_damage), only while no server of the "
                        "node has it open")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--headers-only", action="store_true", help="skip payload checksums (fast; finds no bit rot)")
    return p


def run_args(args: argparse.Namespace) -> int:
    try:
        cfg = L3Config.from_file(args.config)
    except L3ConfigError as e:
        print(f"l3 fsck: {args.config}: {e}", file=sys.stderr)
        return exit_codes.USAGE
    # On stderr, and only once a run has taken a few seconds; --json output is for a program, it gets none.
    progress = Progress.off() if args.json else Progress("l3 fsck", sys.stderr)
    try:
        rep = fsck(cfg, repair=args.repair, headers_only=args.headers_only, progress=progress)
    except IndexDamagedError as e:  # cut short while servers have it open: left to them (stop them, then --repair)
        print(f"l3 fsck: {e}", file=sys.stderr)
        return exit_codes.LEFT
    except (OSError, lmdb.Error) as e:
        print(f"l3 fsck: cannot check: {e}", file=sys.stderr)
        return exit_codes.OPERATIONAL
    print(json.dumps(rep.as_dict(), indent=2, sort_keys=True) if args.json else rep.render())
    return rep.exit_code


def fsck_main(argv: list[str] | None = None) -> int:
    return run_args(build_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(fsck_main())
