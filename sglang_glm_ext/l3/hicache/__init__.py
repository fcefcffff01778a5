"""L3 as SGLang's HiCache storage tier, every rank (attention CP included): ``--enable-cp-l3 --cp-l3-config l3.toml``.

Carries seed lines 163-180 (same-suffix requests in one tick), 251-281 (only a durable prefix is loaded),
393-425 (spill/reload wiring, object-granular acks), 458-486 (the flags, validation, store construction); under CP
128-151, 181-222, 367-392, 426-457, 522-560 (owner lanes: each page written by one owner, GC per owner).

Plan apart from run (as SGLang's HF3FS and Mooncake backends keep theirs):

* ``backend.py``: ``L3HiCacheStorage``, the ``HiCacheStorage`` subclass SGLang builds; a thin adapter whose
  methods each hand their call on in a line, through one guard and one error net.
* ``plan.py``: the attach plan, decided once (served pools as frozen per-pool records, namespace, L3 rank, CP
  writers), from ``sglang_pools.py`` (what it reads off SGLang's host pools and runtime context),
  ``pool_plans.py`` (host pool layouts -> ``PageLayout``, the written layout decisions), ``keys.py`` (string keys,
  namespaces, sidecar pools' format-bound keys), ``cp_writers.py`` (node placement, one owner per page under CP),
  ``parts.py`` (the part of a page a CP rank holds under DSA cache layer split, the MIN-coverage check, the
  KV-sharding stripe and the refusals of the modes not served)
  and ``extra_config.py`` (what SGLang's ``dynamic`` factory hands the backend).
* ``datapath.py``: the run: SGLang's calls against the store with nothing left to decide.
* ``metrics.py``: the ``sglang:cp_l3_*`` metrics and when an attach pushes them.

The hooks that put the backend into SGLang are the feature's (``l3/hooks.py``, declared in ``l3/patches.py``).
Design: ``docs_internal/l3_hicache.md``, under CP ``docs_internal/l3_cp.md``.
"""
