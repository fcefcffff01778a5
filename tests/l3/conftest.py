"""Fixtures shared by the L3 tests.

With ``--import-mode=importlib`` a test module cannot import helpers from another test file, so what the store
tests share lives here as fixtures, parameterised by the module that asks: each module keeps its own page size and
config (they differ on purpose: a page that is not a BLOCK multiple, a tiny GC pool, a shared index).

* ``store``: rank 0 of the module's ``cfg(tmp_path)``, namespace ``NS``, one payload kind ``K`` of ``PB`` bytes;
  closed at teardown whatever the test did.
* ``slab``: an 8-slot ``DiskSlab`` of the module's ``SLOT`` bytes in a directory the open creates.
"""

from __future__ import annotations

import pytest

from sglang_glm_ext.l3.disk.slab import DiskSlab
from sglang_glm_ext.l3.engine.store import L3Store


@pytest.fixture
def store(request, tmp_path):
    m = request.module
    s = L3Store.open(m.cfg(tmp_path), rank=0, namespace=m.NS, page_bytes={m.K: m.PB})
    yield s
    s.close()


@pytest.fixture
def slab(request, tmp_path):
    s = DiskSlab.open(tmp_path / "l3" / "target_kv.rank0.slab", slot_bytes=request.module.SLOT, num_slots=8)
    yield s
    s.close()
