"""What is on an L3 disk and how its bytes move: ``format.py`` (the blob and its checksums), ``slab.py`` (one
preallocated slab file, single-transfer writes), ``slab_reader.py`` (the one read-only view of a slab),
``slab_dir.py`` (where slabs and their sidecars live), ``read_plan.py`` / ``dio_align.py`` (which bytes go straight
into host memory), ``host_layout.py`` (where a page's bytes live in host memory), ``aligned.py`` (aligned buffers),
``owner_lock.py`` (one live owner per rank), ``plp.py`` (power-loss safety), ``space.py`` (O_DIRECT and room for a
budget), ``probe.py`` (each configured path proven before the model loads), ``fsutil.py``. No SGLang, no
torch. Format: ``docs_internal/l3_format.md``."""
