"""What the L3 tests share: the repository root, a GLM-5 namespace, page keys and page bytes, configs.

A plain module, not a test file: ``tests/l3/conftest.py`` puts this folder on ``sys.path`` (pytest runs with
``--import-mode=importlib``, where a test module cannot import another test file). What stays in each test module is
what is particular to it: its page size (some are not a BLOCK multiple on purpose), its salt, its budget and queues.

* ``key(i, salt)`` / ``page(i, salt, nbytes)``: a page's 64-hex-digit key and its bytes, both derived from
  ``f"{salt}{i}"``, so distinct pages never share a content hash (the store dedups by content).
* ``config(tmp_path, budget=..., **over)``: an ``L3Config`` with one disk and the index under ``tmp_path``; ``over``
  replaces top-level keys and merges one level into dict-valued ones (``queues={"io_threads": 1}`` keeps the rest).
* ``write_config(tmp_path, ...)``: an L3 config FILE (the example config, budget ``TEST_BUDGET``), what the
  HiCache backend, the hooks and the demo read.
* ``opens_of(monkeypatch, path)``: every ``open()`` of that file from then on (how many times it is read).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import sys
import threading
import types

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = str(pathlib.Path(__file__).resolve().parent)  # what a child script puts on sys.path to import l3kit

K = PayloadKind.TARGET_KV
NS = Namespace("glm5", "bf16", "page_first", 64, 0, 78, "tp0")  # GLM-5's target KV of one TP rank

# Slabs are preallocated (fallocate): config files keep budgets small (tests/l3/conftest.py also drops each test's
# tmp_path when it ends, so pytest's kept basetemps never pin gigabytes of a shared disk).
TEST_BUDGET = "16MiB"


def namespace(**over) -> Namespace:
    """``NS`` with some fields replaced (another model, layout, layer range or shard)."""
    return dataclasses.replace(NS, **over)


def key(i, salt="k") -> str:
    return hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


def page(i, salt="k", *, nbytes: int) -> np.ndarray:
    return np.frombuffer(hashlib.shake_256(f"{salt}{i}".encode()).digest(nbytes), np.uint8).copy()


def pages_of(nbytes: int):
    """``page`` bound to one page size: the module-level ``page(i, salt)`` of a test module."""
    return functools.partial(page, nbytes=nbytes)


def config_dict(tmp_path, *, budget: int, deployment: "str | None" = "t", map_size: int = 2**24,
                disk: str = "disk", **over) -> dict:
    d: dict = {"disks": [{"path": str(pathlib.Path(tmp_path) / disk), "budget": budget}],
               "index": {"path": str(pathlib.Path(tmp_path) / "index"), "map_size": map_size}}
    if deployment is not None:
        d["deployment_id"] = deployment
    return merged(d, over)


def merged(base: dict, over: dict) -> dict:
    """``base`` with ``over``'s keys: a dict value merges one level into a dict it replaces, anything else replaces."""
    return {**base, **{k: {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                       for k, v in over.items()}}


def config(tmp_path, **kw) -> L3Config:
    return L3Config.from_dict(config_dict(tmp_path, **kw))


def spill_durable(store, idxs, salt="k", *, nbytes: int, kind=K) -> None:
    """Spill pages ``idxs`` and wait until they are durable (every spill accepted, the flush in time)."""
    idxs = list(idxs)
    assert all(store.spill(kind, [key(i, salt) for i in idxs], [page(i, salt, nbytes=nbytes) for i in idxs]))
    assert store.flush(30)


def write_config(tmp_path, name="l3", **overrides) -> str:
    """An L3 config file with TOML overrides (top-level scalars) under tmp_path/name; returns its path."""
    from sglang_glm_ext.l3.config import example_config

    d = pathlib.Path(tmp_path) / name
    d.mkdir(parents=True, exist_ok=True)
    text = example_config(str(d)).replace('budget = "1GiB"', f'budget = "{TEST_BUDGET}"')
    for k, value in overrides.items():
        rendered = f'"{value}"' if isinstance(value, str) else str(value).lower()
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{k} ")]
        text = "\n".join([f"{k} = {rendered}", *lines]) + "\n"
    p = d / "l3.toml"
    p.write_text(text)
    return str(p)


def opens_of(monkeypatch, path) -> list[str]:
    """A list that gets one entry per ``open()`` of ``path`` in this process, until the test ends."""
    import builtins

    want, seen, real = os.path.realpath(path), [], builtins.open

    def counting(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(os.fspath(file)) == want:
            seen.append(os.fspath(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    return seen


def ensure_datasets_importable() -> None:
    """SGLang's storage test kit imports ``datasets`` through ``sglang.benchmark`` (not part of the CPU set-up):
    when it is missing, a stub whose ``load_dataset`` raises is inserted, only in this test process."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        stub = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise RuntimeError("datasets is stubbed in the sglang-glm-ext CPU tests (not installed)")

        stub.load_dataset = load_dataset
        sys.modules["datasets"] = stub


def reads_back(store, idxs, salt="k", *, nbytes: int, kind=K) -> bool:
    """Every page of ``idxs`` reloads as a hit with exactly the bytes it was spilled with."""
    idxs = list(idxs)
    dst = [np.zeros(nbytes, np.uint8) for _ in idxs]
    ok = store.reload_into(kind, [key(i, salt) for i in idxs], dst)
    return all(ok) and all(np.array_equal(d, page(i, salt, nbytes=nbytes)) for d, i in zip(dst, idxs))


class Gate:
    """A slab write fault (``slab.inject_write_fault(gate)``): a pwrite that blocks until ``open`` is set (a stalled
    disk), then fails with ``err`` or writes. ``entered`` is set once a write is inside it."""

    def __init__(self, err=None):
        self.open, self.entered, self.err = threading.Event(), threading.Event(), err

    def __call__(self, fd, data, offset):
        self.entered.set()
        self.open.wait(30)
        if self.err is not None:
            raise OSError(self.err, f"injected: {os.strerror(self.err)}")
        return os.pwrite(fd, data, offset)
