"""Operator tools on top of the L3 engine, run as ``sglang-glm-ext l3 ...`` (l3/cli.py): ``fsck`` reads the index
and the slabs through the engine's disk / format / index primitives, never through a store; ``bench`` measures a
store against the raw disk."""
