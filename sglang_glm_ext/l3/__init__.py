"""L3: a durable, integrity-checked disk tier for SGLang HiCache KV pages.

Carries seed lines 231-250 (cold start), 367-392 (page-level LRU GC), 426-457 (gather -> O_DIRECT write ->
fdatasync -> index commit), 476-521 (slab accessor, O_DIRECT slab, config, blob header + checksum, slot pool).
Pure engine: imports no SGLang internals and no torch, so it runs next to any torch version.
"""
