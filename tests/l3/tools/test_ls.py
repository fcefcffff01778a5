"""`l3 ls`: deployments, ranks, kinds, pages and bytes of a real index, and each rank's slabs with their sizes;
from a config or from the index directory alone; read-only."""

import hashlib
import json
import os

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine.index import deployment_tag
from sglang_glm_ext.l3.engine.store import L3Store
from sglang_glm_ext.l3.tools.ls import inventory, ls_main, render

PB = 4096 + 50
SLOT = slot_bytes_for(PB)
PB_I = 1000
SLOT_I = slot_bytes_for(PB_I)
NS = Namespace("glm5", "bf16", "page_first", 64, 0, 78, "tp0")
K, I = PayloadKind.TARGET_KV, PayloadKind.INDEX_K


def key(i):
    return hashlib.sha256(f"ls{i}".encode()).hexdigest()


def write_config(tmp_path, dep, ranks=1):
    p = tmp_path / f"{dep}.toml"
    p.write_text(f'deployment_id = "{dep}"\n[[disks]]\npath = "{tmp_path}/disk0"\nbudget = {40 * (SLOT + SLOT_I)}\n'
                 f'[[disks]]\npath = "{tmp_path}/disk1"\nbudget = {40 * (SLOT + SLOT_I)}\n'
                 f'[ranks]\ncount = {ranks}\n[index]\npath = "{tmp_path}/index"\nmap_size = "16MiB"\n')
    return str(p)


def fill(cfg_path, rank, pages: dict):
    cfg = L3Config.from_file(cfg_path)
    s = L3Store.open(cfg, rank=rank, namespace=NS, page_bytes={K: PB, I: PB_I})
    for kind, n in pages.items():
        pb = PB if kind is K else PB_I
        assert all(s.spill(kind, [key(100 * rank + i) for i in range(n)], [np.full(pb, j, np.uint8) for j in range(n)]))
    assert s.flush(30)
    s.close()


def node(tmp_path):
    """Deployment "dep": rank 0 on disk0 (7 target_kv, 3 index_k), rank 1 on disk1 (4 target_kv); "other": 5."""
    dep = write_config(tmp_path, "dep", ranks=2)
    fill(dep, 0, {K: 7, I: 3})
    fill(dep, 1, {K: 4})
    other = write_config(tmp_path, "other")
    fill(other, 0, {K: 5})
    return dep, other


def test_ls_of_a_config_lists_every_deployment_rank_kind_with_pages_bytes_and_slabs(tmp_path, capsys):
    dep, _ = node(tmp_path)
    inv = inventory(dep)
    assert inv["entries"] == 19 and inv["this_deployment"] == "dep"
    by = {d["name"]: d for d in inv["deployments"]}
    assert set(by) == {"dep", "other"} and by["dep"]["this_config"] and not by["other"]["this_config"]
    d = by["dep"]
    assert d["pages"] == 14 and d["bytes"] == 11 * SLOT + 3 * SLOT_I
    r0, r1 = d["ranks"]
    assert r0["kinds"] == {"target_kv": {"pages": 7, "bytes": 7 * SLOT}, "index_k": {"pages": 3, "bytes": 3 * SLOT_I}}
    assert r1["kinds"] == {"target_kv": {"pages": 4, "bytes": 4 * SLOT}}
    slabs0 = {s["kind"]: s for s in r0["slabs"]}
    assert set(slabs0) == {"target_kv", "index_k"}
    assert slabs0["target_kv"]["disk"] == 0 and slabs0["target_kv"]["num_slots"] == 40
    assert slabs0["target_kv"]["file_bytes"] == slabs0["target_kv"]["expected_bytes"] == 40 * SLOT
    assert {s["disk"] for s in r1["slabs"]} == {1}  # rank 1 maps to the second disk (balanced)
    assert by["other"]["pages"] == 5 and by["other"]["ranks"][0]["kinds"]["target_kv"]["bytes"] == 5 * SLOT
    text = render(inv)
    assert "deployment 'dep' (this config): 14 pages" in text and "deployment 'other': 5 pages" in text
    assert "rank 0: target_kv 7 pages" in text and "index_k 3 pages" in text
    assert f"slab target_kv (disk 1) {tmp_path}/disk1/dep/rank1/target_kv.slab: 40 slots" in text
    assert ls_main([dep, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deployments"][0]["name"] == "dep"


def test_ls_of_the_index_directory_finds_names_and_slabs_through_the_owner_lock_files(tmp_path):
    dep, _ = node(tmp_path)
    inv = inventory(str(tmp_path / "index"))
    by = {d["name"]: d for d in inv["deployments"]}
    assert set(by) == {"dep", "other"} and by["dep"]["bytes"] == 11 * SLOT + 3 * SLOT_I
    assert [len(r["slabs"]) for r in by["dep"]["ranks"]] == [2, 2]
    assert {s["disk"] for s in by["dep"]["ranks"][1]["slabs"]} == {1}  # from the sidecars: no config to say it
    assert inv["config"] is None and not any(d["this_config"] for d in inv["deployments"])


def test_ls_marks_a_truncated_slab_and_a_deployment_nothing_names(tmp_path):
    import shutil

    dep, _ = node(tmp_path)
    os.truncate(tmp_path / "disk0" / "dep" / "rank0" / "target_kv.slab", 10 * SLOT)
    os.unlink(tmp_path / "index" / "owner-other-rank0.lock")
    shutil.rmtree(tmp_path / "disk0" / "other")
    inv = inventory(dep)
    (t,) = [s for d in inv["deployments"] for r in d["ranks"] for s in r["slabs"] if s["truncated"]]
    assert t["slots_lost"] == 30 and t["file_bytes"] == 10 * SLOT
    (unknown,) = [d for d in inv["deployments"] if d["name"] is None]
    assert unknown["tag"] == deployment_tag("other").hex() and unknown["pages"] == 5 and unknown["bytes"] is None
    text = render(inv)
    assert "TRUNCATED, 30 slots lost" in text and f"tag {unknown['tag']} (name unknown" in text


def test_ls_never_creates_an_index_and_says_so(tmp_path, capsys):
    dep = write_config(tmp_path, "fresh")
    assert ls_main([dep]) == 0
    out = capsys.readouterr().out
    assert "does not exist yet" in out and "deployment 'fresh' (this config): no index entries" in out
    assert not os.path.exists(tmp_path / "index")
    assert ls_main([str(tmp_path)]) == 16  # a directory that is no index: one line, usage/config status
    assert ls_main([str(tmp_path / "nope.toml")]) == 16
    err = capsys.readouterr().err
    assert "no data.mdb" in err and err.count("\n") == 2 and "Traceback" not in err
