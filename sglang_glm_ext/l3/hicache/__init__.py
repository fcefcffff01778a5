"""L3 as SGLang's HiCache storage tier, every rank (attention CP included): ``--enable-cp-l3 --cp-l3-config l3.toml``.

Carries seed lines 163-180 (same-suffix requests in one tick), 251-281 (only a durable prefix is loaded),
393-425 (spill/reload wiring, object-granular acks), 458-486 (the flags, validation, store construction); under CP
128-151, 181-222, 367-392, 426-457, 522-560 (owner lanes: each page written by one owner, GC per owner).

* ``hooks.py``: the flags become SGLang's ``dynamic`` storage backend before ``resolve_once``; the logical KV dtype
  reaches the backend (declared patches in ``l3/patches.py``).
* ``backend.py``: ``L3HiCacheStorage`` (the ``HiCacheStorage`` subclass; SGLang-facing).
* pure core, no SGLang: ``owners.py`` (node placement, replica sets, one owner per page under CP), ``keys.py``
  (string keys, namespaces, sidecar pools' format-bound keys), ``layouts.py`` (host pool layouts -> ``PageLayout``, the written layout decisions), ``attach.py`` (the extra config). What SGLang
  expects of a backend beyond that (a page visible as soon as ``batch_set`` returns, one store per (config, rank)
  per process, a payload kind added after open) is the store's: ``L3Store`` (``l3/store.py``).
* ``doctor.py``: the backend's part of ``sglang-glm-ext doctor``; ``demo.py``: ``sglang-glm-ext demo``.
* ``testing/``: demo/test-only CPU stand-ins for SGLang's GPU copy ops, a HiCache stack driver and one
  attention-CP rank as a process (``cp_ranks.py``, gloo).

Design: ``docs_internal/l3_hicache.md``, under CP ``docs_internal/l3_cp.md``.
"""
