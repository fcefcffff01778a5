"""The L3 engine: ``L3Store`` (``store.py``, the caller API: spill, exists, reload, free, clear, flush; its rooms
``shared.py``, ``lifecycle.py``, ``spill.py``, ``stats.py``, ``diagnostics.py``, ``latency.py``) and what runs
under it. ``staging.py`` (accepted pages until durable), ``writer.py`` (the one owner of slot pools and LRUs)
and ``committer.py`` (fdatasync, then the index commit), ``reclaim.py`` (every way a slot comes back),
``coldstart.py`` (what a restart keeps), ``reload.py`` (the read path, one owner from keys to verified bytes),
``index.py`` / ``index_entry.py`` (the shared LMDB index, its entry codec), ``index_check.py`` / ``index_walk.py`` /
``index_salvage.py`` (its guard), ``kinds.py`` / ``slab_set.py`` / ``slot_pool.py`` (a kind's slabs and slots),
``messages.py`` (what the threads hand each other), ``counters.py`` / ``health.py``. No SGLang, no torch.
Who owns what: ``docs_internal/l3_design.md``."""
