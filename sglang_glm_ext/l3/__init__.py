"""L3: a durable, integrity-checked disk tier for SGLang HiCache KV pages.

Carries seed lines 231-250 (cold start), 367-392 (page-level LRU GC), 426-457 (gather -> O_DIRECT write ->
fdatasync -> index commit), 476-521 (slab accessor, O_DIRECT slab, config, blob header + checksum, slot pool).
Pure engine: imports no SGLang internals and no torch, so it runs next to any torch version. `feature.py`
declares the l3 feature (its flags, its env var, the config check at startup); `patches.py` is empty until the
HiCache backend wires the engine into SGLang; `doctor.py` (with `diskcheck.py`) probes the configured paths;
`cli.py` adds `sglang-glm-ext l3 ...`.
"""
