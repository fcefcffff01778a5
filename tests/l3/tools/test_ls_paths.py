"""`l3 ls` after an L3 tree was copied (index and disks under one directory): the owner locks in the copy still name
the original's slab directories by absolute path, and the listing must be the copy's own slabs, not the
original's, from the index directory alone or from the copy's config. Where only the index was copied, the recorded
path is all there is, and it is used."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine.store import L3Store
from sglang_glm_ext.l3.tools.ls import inventory

PB = 4096 + 50
SLOT = slot_bytes_for(PB)
NS = Namespace("glm5", "bf16", "page_first", 64, 0, 78, "tp0")


def tree(root):
    """root/l3.toml, root/index, root/disk0/dep/rank0 with 5 pages."""
    os.makedirs(root)
    cfg_path = os.path.join(root, "l3.toml")
    with open(cfg_path, "w") as f:  # relative paths: a copy's config names the copy
        f.write(f'deployment_id = "dep"\n[[disks]]\npath = "disk0"\nbudget = {40 * SLOT}\n'
                f'[index]\npath = "index"\nmap_size = "16MiB"\n')
    s = L3Store.open(L3Config.from_file(cfg_path), rank=0, namespace=NS, page_bytes={PayloadKind.TARGET_KV: PB})
    keys = [hashlib.sha256(f"c{i}".encode()).hexdigest() for i in range(5)]
    assert all(s.spill(PayloadKind.TARGET_KV, keys, [np.full(PB, i, np.uint8) for i in range(5)]))
    assert s.flush(30)
    s.close()
    return cfg_path


def slabs(inv):
    (dep,) = [d for d in inv["deployments"] if d["name"] == "dep"]
    return [s["path"] for r in dep["ranks"] for s in r["slabs"]]


def test_a_copied_tree_lists_its_own_slabs_from_its_index_alone(tmp_path):
    orig = str(tmp_path / "orig")
    tree(orig)
    copy = str(tmp_path / "copy")
    shutil.copytree(orig, copy)
    locks = [n for n in os.listdir(os.path.join(copy, "index")) if n.startswith("owner-")]
    assert locks and orig in open(os.path.join(copy, "index", locks[0])).read()  # what the copy's lock still says
    assert slabs(inventory(os.path.join(orig, "index"))) == [f"{orig}/disk0/dep/rank0/target_kv.slab"]
    assert slabs(inventory(os.path.join(copy, "index"))) == [f"{copy}/disk0/dep/rank0/target_kv.slab"]


def test_a_copied_trees_config_lists_its_slabs_once(tmp_path):
    orig = str(tmp_path / "orig")
    tree(orig)
    copy = str(tmp_path / "copy")
    shutil.copytree(orig, copy)
    assert slabs(inventory(os.path.join(copy, "l3.toml"))) == [f"{copy}/disk0/dep/rank0/target_kv.slab"]


def test_an_index_copied_alone_finds_the_slabs_where_its_locks_say(tmp_path):
    orig = str(tmp_path / "orig")
    tree(orig)
    elsewhere = str(tmp_path / "backup" / "index")
    shutil.copytree(os.path.join(orig, "index"), elsewhere)
    assert slabs(inventory(elsewhere)) == [f"{orig}/disk0/dep/rank0/target_kv.slab"]
