"""Fixtures shared by the L3 tests; the values and helpers they share are in ``l3kit.py`` (this folder is put on
``sys.path`` here: with ``--import-mode=importlib`` a test module cannot import another test file).

The store fixtures are parameterised by the module that asks: each module keeps its own page size and config (they
differ on purpose: a page that is not a BLOCK multiple, a tiny GC pool, a shared index).

* ``store``: rank 0 of the module's ``cfg(tmp_path)``, namespace ``NS``, one payload kind ``K`` of ``PB`` bytes;
  closed at teardown whatever the test did.
* ``slab``: an 8-slot ``DiskSlab`` of the module's ``SLOT`` bytes in a directory the open creates.
* ``plugin`` / ``standins`` (module scope): the plugin registered (its L3 patches applied) / SGLang's HiCache stack
  made to run on a CPU (sglang_glm_ext/l3/demo/cpu_standins.py), removed after the module.
* ``l3_config``: a small valid L3 config file under tmp_path; returns its path.
* every test's tmp_path is dropped when it ends: slabs are preallocated, and the basetemp directories pytest keeps
  around must not pin gigabytes of a shared disk.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import l3kit  # noqa: E402

from sglang_glm_ext.l3.disk.slab import DiskSlab  # noqa: E402
from sglang_glm_ext.l3.engine.store import L3Store  # noqa: E402

# SGLang's native page hash is a JIT C++ extension: build it inside the checkout, not in ~/.cache.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(l3kit.REPO / ".torch_extensions"))


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


@pytest.fixture(autouse=True)
def _drop_slabs(tmp_path):
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def l3_config(tmp_path):
    return l3kit.write_config(tmp_path)


@pytest.fixture(scope="module")
def plugin():
    import sglang_glm_ext

    ledger = sglang_glm_ext.register()
    assert ledger is not None
    bad = [s for s in ledger.status.values()
           if s.patch.feature.name == "l3" and s.patch.tier.value != "demo" and s.state.value != "applied"]
    assert not bad, bad
    return ledger


@pytest.fixture(scope="module")
def standins(plugin):
    from sglang_glm_ext.l3.demo import cpu_standins

    cpu_standins.install()
    yield cpu_standins
    cpu_standins.uninstall()


@pytest.fixture(scope="module")
def published(standins):
    """SGLang's server args for a module that builds host pools (they read them), withdrawn after it."""
    import leakguard
    from sglang_glm_ext.l3.demo import stack

    with leakguard.kept():
        stack.publish_server_args(stack.StackSpec(), storage_backend=None, extra_config=None)
        yield
