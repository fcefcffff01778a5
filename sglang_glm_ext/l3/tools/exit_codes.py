"""Exit codes of the L3 tools. ``l3 fsck`` and ``l3 ls`` follow e2fsck's, so a script can tell "the store needed a
repair" from "the store is still broken" from "the tool could not look": one value per run (not OR-ed bits).
``l3 example-config`` and ``l3 bench`` follow the rest of the CLI (0 done, 1 failed, 2 refused). Each tool's
``(code, meaning)`` pairs below are its help epilog and its rows of docs/cli.md (plugin/cli.py's EXIT_STATUS)."""

CLEAN = 0  # nothing wrong (fsck), or the listing was printed (ls)
REPAIRED = 1  # fsck --repair: errors were found and every one was repaired
LEFT = 4  # fsck: errors found and left unrepaired (no --repair, or what --repair cannot mend: a damaged index page)
OPERATIONAL = 8  # the tool could not do its job: the index or a slab could not be opened or read (I/O, permission)
USAGE = 16  # bad usage or config: an option argparse refuses, a config that does not load, a deployment_id that
#             names nothing on this node while the index holds other deployments (a typo)

MEANINGS = ((CLEAN, "clean"), (REPAIRED, "errors found and all repaired"), (LEFT, "errors left unrepaired"),
            (OPERATIONAL, "operational error (I/O, permission)"), (USAGE, "usage or config error"))
SUMMARY = ", ".join(f"{code} {meaning}" for code, meaning in MEANINGS)  # what fsck's help and the README say
EPILOG = f"exit status: {SUMMARY} (as e2fsck's)"

LS = ((CLEAN, "listed"), (OPERATIONAL, "the index cannot be opened or read"),
      (USAGE, "usage or config error (a config that does not load, a directory without an index)"))
WRITTEN, NOT_WRITTEN, REFUSED = 0, 1, 2
EXAMPLE_CONFIG = ((WRITTEN, "written"),
                  (NOT_WRITTEN, "the system refused the write (permission, read-only file system, disk full)"),
                  (REFUSED, "usage error, or DIR/l3.toml exists (--force replaces it), or DIR or a part of it is a "
                            "file"))
BENCH_MISSED = 3
BENCH = ((0, "every target met"), (2, "usage error (a bad number included)"),
         (BENCH_MISSED, "the bench ran and a row is FAIL (listed on stderr)"))


def epilog(meanings) -> str:
    """``exit status: 0 written, 1 ...`` for a command's help."""
    return "exit status: " + ", ".join(f"{code} {meaning}" for code, meaning in meanings)
