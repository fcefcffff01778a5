"""Operator tools on top of the L3 engine, run as ``sglang-glm-ext l3 ...`` (l3/cli.py): ``fsck`` and ``ls`` read
the index and the slabs through the engine's disk / format / index primitives, never through a store (fsck's
``--repair`` writes only index deletes and a truncated slab's size); ``bench`` measures a store against the raw
disk. Their exit codes: ``exit_codes.py``."""
