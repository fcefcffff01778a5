"""The L3 engine: ``L3Store`` (``store.py``, the caller API: spill, exists, reload, free, clear, flush) and what
runs under it. ``staging.py`` (accepted pages until durable), ``writer.py`` (the one owner of slot pools and LRUs)
and ``committer.py`` (fdatasync, then the index commit), ``reclaim.py`` (every way a slot comes back),
``coldstart.py`` (what a restart keeps), ``reload.py`` (the read path, one owner from keys to verified bytes),
``index.py`` (the shared LMDB index), ``kinds.py`` / ``slab_set.py`` / ``slot_pool.py`` (a kind's slabs and slots),
``messages.py`` (what the threads hand each other), ``counters.py`` / ``health.py``. No SGLang, no torch.
Who owns what: ``docs_internal/l3_design.md``."""
