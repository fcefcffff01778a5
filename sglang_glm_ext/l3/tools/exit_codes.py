"""Exit codes of the L3 tools (``l3 fsck``, ``l3 ls``), after e2fsck's, so a script can tell "the store needed a
repair" from "the store is still broken" from "the tool could not look": one value per run (not OR-ed bits)."""

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
