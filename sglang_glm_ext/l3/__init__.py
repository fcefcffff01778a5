"""L3: a durable, integrity-checked disk tier for SGLang HiCache KV pages (``--enable-cp-l3 --cp-l3-config``).

Carries seed lines 163-180, 231-250 (cold start), 251-281, 367-392 (page-level LRU GC), 393-425, 426-457 (gather ->
O_DIRECT write -> fdatasync -> index commit), 458-486, 476-521 (slab, config, blob header + checksum, slot pool).

Rooms, bottom up (``tests/test_layering.py`` keeps each importing only the rooms below it):

* ``config.py``, ``errors.py``: the config (loaded once per process) and the errors raised at open; leaves.
* ``disk/``: what is on a disk and how bytes move between it and host memory: the blob format, slab files and the
  one slab reader, read plans and direct-I/O alignment, host page layouts, the owner lock, PLP and space checks.
* ``engine/``: the store (``L3Store``, the caller API) and what runs under it: staging, the writer and committer
  threads, reclaim, cold start, the read path (``reload.py``), the LMDB index, slot pools, counters.
* ``hicache/``: SGLang's HiCache storage backend: its attach plan (one frozen record per host pool), its data path,
  what it reads off SGLang's pools, keys and namespaces, CP writers, the extra config, metrics.
* ``tools/``: ``fsck`` and ``bench`` (``sglang-glm-ext l3 ...``).
* the feature files: ``feature.py`` (flags, env var, THE launch check of a config), ``patches.py`` (what L3
  patches in SGLang), ``hooks.py`` (those patches' hooks), ``doctor.py`` (L3's one doctor part), ``cli.py``.
* ``demo/``: ``sglang-glm-ext demo`` and its CPU HiCache stack (demo/test-only stand-ins, never in a server).

The engine, disk and tools rooms import neither SGLang nor torch, so they run next to any torch version (and fsck
and bench on machines without either). Design: ``docs_internal/l3_design.md``, format: ``l3_format.md``.
"""
