"""L3Config: loading, validation with key paths, rank->disk mapping, budget split, example config."""

import json
import os

import pytest

from sglang_glm_ext.l3.config import L3Config, L3ConfigError, example_config, parse_size, write_example_config


def _base(tmp_path, **over):
    d = {
        "disks": [{"path": str(tmp_path / "d0"), "budget": "1GiB"}],
        "index": {"path": str(tmp_path / "idx")},
    }
    d.update(over)
    return d


def test_example_config_is_valid_and_uses_dir(tmp_path):
    path = write_example_config(tmp_path / "cfg")
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
    cfg = L3Config.from_file(path)
    assert cfg.disks[0].path.startswith(str(tmp_path / "cfg"))
    assert cfg.index_path.startswith(str(tmp_path / "cfg"))
    assert cfg.cold_start == "clear" and cfg.gc_start == 0.90 and cfg.gc_stop == 0.85
    assert str(tmp_path) in example_config(tmp_path)


def test_example_config_never_overwrites_an_edited_file_unless_forced(tmp_path):
    path = write_example_config(tmp_path)
    with open(path, "a") as f:
        f.write("# my edit\n")
    edited = open(path).read()
    with pytest.raises(FileExistsError):
        write_example_config(tmp_path)
    assert open(path).read() == edited
    assert write_example_config(tmp_path, force=True) == path
    assert open(path).read() == example_config(tmp_path) and os.listdir(tmp_path) == ["l3.toml"]
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)


def test_toml_and_json_load_the_same(tmp_path):
    data = _base(tmp_path, ranks={"count": 4, "mapping": "balanced"}, gc={"start": 0.8, "stop": 0.5})
    jp = tmp_path / "c.json"
    jp.write_text(json.dumps(data))
    tp = tmp_path / "c.toml"
    tp.write_text(f'[[disks]]\npath = "{tmp_path}/d0"\nbudget = "1GiB"\n[index]\npath = "{tmp_path}/idx"\n'
                  f'[ranks]\ncount = 4\nmapping = "balanced"\n[gc]\nstart = 0.8\nstop = 0.5\n')
    a, b = L3Config.from_file(jp), L3Config.from_file(tp)
    assert a == b
    assert a.rank_to_disk == (0, 0, 0, 0)


def test_relative_paths_resolve_next_to_the_file(tmp_path):
    tp = tmp_path / "c.toml"
    tp.write_text('[[disks]]\npath = "slabs"\nbudget = 4096000\n[index]\npath = "idx"\n')
    cfg = L3Config.from_file(tp)
    assert cfg.disks[0].path == str(tmp_path / "slabs")
    assert cfg.index_path == str(tmp_path / "idx")


def test_balanced_and_explicit_mapping(tmp_path):
    disks = [{"path": str(tmp_path / f"d{i}"), "budget": 3000 * 4096} for i in range(2)]
    cfg = L3Config.from_dict(_base(tmp_path, disks=disks, ranks={"count": 3}))
    assert cfg.rank_to_disk == (0, 1, 0)
    assert cfg.ranks_on_disk(0) == [0, 2]
    assert cfg.rank_budget(0) == 1500 * 4096 and cfg.rank_budget(1) == 3000 * 4096
    cfg = L3Config.from_dict(_base(tmp_path, disks=disks, ranks={"mapping": [1, 1, 0]}))
    assert cfg.num_ranks == 3 and cfg.disk_for_rank(0) == 1


@pytest.mark.parametrize("ranks,needle", [
    ({"count": 2, "mapping": [0, 0, 0]}, "ranks.mapping: has 3 entries"),
    ({"mapping": [0, 2]}, "ranks.mapping[1]: disk index 2 out of range"),
    ({"mapping": [0, -1]}, "ranks.mapping[1]"),
    ({"mapping": "round_robin"}, "ranks.mapping: unknown mapping"),
    ({"count": 0}, "ranks.count"),
])
def test_bad_mapping_is_loud_with_key_path(tmp_path, ranks, needle):
    disks = [{"path": str(tmp_path / f"d{i}"), "budget": 2**30} for i in range(2)]
    with pytest.raises(L3ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        L3Config.from_dict(_base(tmp_path, disks=disks, ranks=ranks))


@pytest.mark.parametrize("over,needle", [
    ({"cold_start": "warm"}, "cold_start: unknown mode"),
    ({"gc": {"start": 0.8, "stop": 0.9}}, "gc.start: must be greater than gc.stop"),
    ({"gc": {"start": 1.5}}, "gc.start: must be in"),
    ({"gc": {"stop": 0}}, "gc.stop: must be in"),
    ({"gc": {"budget_per_round": -1}}, "gc.budget_per_round"),
    ({"queues": {"staging_bytes": "lots"}}, "queues.staging_bytes: cannot parse"),
    ({"queues": {"max_inflight": 0}}, "queues.max_inflight"),
    ({"plp": "maybe"}, "plp: unknown value"),
    ({"require_plp": "yes"}, "require_plp: expected bool"),
    ({"deployment_id": "a/b"}, "deployment_id"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"disks": []}, "disks: at least one disk"),
    ({"disks": [{"path": "/x"}]}, r"disks\[0\].budget: required"),
    ({"disks": [{"path": "/x", "budget": 0}]}, r"disks\[0\].budget: must be > 0"),
    ({"index": {}}, "index.path: required"),
    ({"index": {"path": "/i", "map_size": 1000}}, "index.map_size"),
    ({"payload_split": "weights"}, "payload_weights"),
    ({"payload_split": "weights", "payload_weights": {"nope": 1}}, "payload_weights.nope"),
    ({"writers": {"mode": "everyone"}}, "writers.mode: unknown mode"),
    ({"writers": {"count": 2}}, "writers.count: unknown key"),
    ({"writers": "spread"}, "writers: expected"),
    ({"ack": "eventually"}, "ack: unknown mode"),
    ({"queues": {"wait_ms": -1}}, "queues.wait_ms"),
    ({"queues": {"wait_ms": 1.5}}, "queues.wait_ms"),
    ({"ack": "durable", "queues": {"wait_ms": 0}}, "queues.wait_ms: ack = 'durable'"),
    ({"queues": {"layer_first_reads": "bounce"}}, "queues.layer_first_reads: unknown mode"),
    ({"queues": {"layer_first_reads": True}}, "queues.layer_first_reads: expected"),
    ({"queues": {"read_coalesce_bytes": -1}}, "queues.read_coalesce_bytes: must be > 0"),
    ({"queues": {"read_coalesce_bytes": True}}, "queues.read_coalesce_bytes: expected a byte size"),
    ({"queues": {"read_coalesce_bytes": "lots"}}, "queues.read_coalesce_bytes: cannot parse"),
    ({"queues": {"read_coalesce_bytes": "2GiB"}}, "queues.read_coalesce_bytes: at most 1 GiB"),
    ({"queues": {"layer_first_gil_pause": "chunk"}}, "queues.layer_first_gil_pause: unknown value"),
    ({"queues": {"layer_first_gil_pause": True}}, "queues.layer_first_gil_pause: expected a byte size"),
    ({"queues": {"layer_first_gil_pause": "4KiB"}}, r"queues.layer_first_gil_pause: a size must be in \[64 KiB"),
    ({"queues": {"layer_first_gil_pause": "2GiB"}}, r"queues.layer_first_gil_pause: a size must be in \[64 KiB"),
    ({"queues": {"layer_first_gil_pause": -1}}, "queues.layer_first_gil_pause: must be > 0"),
    ({"queues": {"layer_first_gil_pause": 1.5}}, "queues.layer_first_gil_pause: expected a byte size"),
])
def test_every_bad_value_names_its_key(tmp_path, over, needle):
    with pytest.raises(L3ConfigError, match=needle):
        L3Config.from_dict(_base(tmp_path, **over))


def test_layer_first_reads_default_to_vectored_and_reach_the_reload_path(tmp_path):
    """queues.layer_first_reads picks how the store reads a layer-first page (engine/reload.py): its default is the
    vectored read, and "single" reaches the store that the config opens."""
    from sglang_glm_ext.l3.disk.format import Namespace
    from sglang_glm_ext.l3.engine.store import L3Store

    assert L3Config.from_dict(_base(tmp_path)).layer_first_reads == "vectored"
    ns = Namespace("m", "bf16", "layer_first", 64, 0, 4, "d")
    for mode, vectored in (("vectored", True), ("single", False)):
        root = tmp_path / mode
        cfg = L3Config.from_dict({"disks": [{"path": str(root / "d"), "budget": "8MiB"}],
                                  "index": {"path": str(root / "i"), "map_size": "16MiB"},
                                  "queues": {"layer_first_reads": mode}})
        assert cfg.layer_first_reads == mode
        s = L3Store.open(cfg, rank=0, namespace=ns, page_bytes={"target_kv": 16384})
        try:
            assert s.diagnostics().vectored is vectored
        finally:
            s.close()


def test_writers_mode_defaults_to_spread_and_reads_one_per_node(tmp_path):
    assert L3Config.from_dict(_base(tmp_path)).writer_mode == "spread"
    assert L3Config.from_dict(_base(tmp_path, writers={"mode": "one_per_node"})).writer_mode == "one_per_node"


# Issue 7, item 2: a deployment id names a directory, so it must be a plain name, never a path.
@pytest.mark.parametrize("dep", [".", "..", ".hidden", "-rf", "a/b", "a\\b", "", "x" * 65, "a b", "dép", "a\0b"])
def test_deployment_id_must_be_a_plain_name(tmp_path, dep):
    with pytest.raises(L3ConfigError, match=r"^deployment_id: .*plain name"):
        L3Config.from_dict(_base(tmp_path, deployment_id=dep))


@pytest.mark.parametrize("dep", ["default", "glm5_prod-2", "A.b", "_x", "9" * 64])
def test_plain_deployment_ids_are_accepted(tmp_path, dep):
    assert L3Config.from_dict(_base(tmp_path, deployment_id=dep)).deployment_id == dep


def test_unreadable_or_invalid_file_is_loud(tmp_path):
    with pytest.raises(L3ConfigError, match="cannot read"):
        L3Config.from_file(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[disks]\n")
    with pytest.raises(L3ConfigError, match="not valid TOML"):
        L3Config.from_file(bad)


def test_parse_size_units():
    assert parse_size("64MiB", "k") == 64 * 2**20
    assert parse_size("2GB", "k") == 2 * 10**9
    assert parse_size(4096, "k") == 4096
    with pytest.raises(L3ConfigError):
        parse_size(True, "k")


def test_budget_split_equal_slots_and_weights(tmp_path):
    cfg = L3Config.from_dict(_base(tmp_path, disks=[{"path": str(tmp_path / "d"), "budget": 100 * 4096}],
                                   ranks={"count": 2}))
    # 2 ranks share the disk: 50 blocks each; equal slot counts: 50 // (1 + 4) = 10 slots per kind.
    assert cfg.slots_per_kind(1, {"target_kv": 4 * 4096, "index_k": 4096}) == {"target_kv": 10, "index_k": 10}
    cfg = L3Config.from_dict(_base(tmp_path, disks=[{"path": str(tmp_path / "d"), "budget": 100 * 4096}],
                                   payload_split="weights", payload_weights={"target_kv": 3, "index_k": 1}))
    assert cfg.slots_per_kind(0, {"target_kv": 4096, "index_k": 4096}) == {"target_kv": 75, "index_k": 25}
    with pytest.raises(L3ConfigError, match="payload_weights.draft_kv"):
        cfg.slots_per_kind(0, {"draft_kv": 4096})


def test_weights_split_a_rank_over_every_declared_kind_whatever_is_opened(tmp_path):
    # Issue 10 (N4): a kind's slot count comes from the config alone, so a kind added after open (a sidecar draft
    # pool SGLang registers after the storage attach) and a restart that opens every kind at once give each slab
    # the same geometry. A declared kind that is never opened keeps its share unused.
    cfg = L3Config.from_dict(_base(tmp_path, disks=[{"path": str(tmp_path / "d"), "budget": 100 * 4096}],
                                   payload_split="weights",
                                   payload_weights={"target_kv": 3, "index_k": 1, "draft_kv": 1}))
    together = cfg.slots_per_kind(0, {"target_kv": 4096, "index_k": 4096, "draft_kv": 2 * 4096})
    assert together == {"target_kv": 60, "index_k": 20, "draft_kv": 10}
    assert cfg.slots_per_kind(0, {"target_kv": 4096, "index_k": 4096}) == {"target_kv": 60, "index_k": 20}
    assert cfg.slots_for_kind(0, "draft_kv", 2 * 4096) == 10
    assert cfg.addable_kinds == ("target_kv", "index_k", "draft_kv")


def test_equal_slots_cannot_size_a_kind_on_its_own(tmp_path):
    cfg = L3Config.from_dict(_base(tmp_path))
    assert cfg.addable_kinds == ()
    with pytest.raises(L3ConfigError, match=r"payload_split = 'equal_slots'.*payload_weights"):
        cfg.slots_for_kind(0, "draft_kv", 4096)
    weighted = L3Config.from_dict(_base(tmp_path, payload_split="weights", payload_weights={"target_kv": 1}))
    with pytest.raises(L3ConfigError, match="payload_weights.draft_kv"):
        weighted.slots_for_kind(0, "draft_kv", 4096)


def test_budget_too_small_for_one_page_is_loud(tmp_path):
    cfg = L3Config.from_dict(_base(tmp_path, disks=[{"path": str(tmp_path / "d"), "budget": 4096}]))
    with pytest.raises(L3ConfigError, match=r"disks\[0\].budget"):
        cfg.slots_per_kind(0, {"target_kv": 8192})


def test_rank_out_of_range(tmp_path):
    cfg = L3Config.from_dict(_base(tmp_path, ranks={"count": 2}))
    with pytest.raises(L3ConfigError, match="rank 2 out of range"):
        cfg.disk_for_rank(2)


def test_the_cold_start_env_override_is_applied_where_the_config_loads(tmp_path, monkeypatch):
    """The engine reads one value: the config's. SGLANG_CP_L3_COLD_START replaces the file's cold_start when the
    config is loaded, and a bad value is refused there, naming the variable (before any store opens)."""
    monkeypatch.setenv("SGLANG_CP_L3_COLD_START", "load")
    assert L3Config.from_dict(_base(tmp_path)).cold_start == "load"
    assert L3Config.from_dict(_base(tmp_path, cold_start="clear")).cold_start == "load"
    monkeypatch.setenv("SGLANG_CP_L3_COLD_START", "")
    assert L3Config.from_dict(_base(tmp_path, cold_start="load")).cold_start == "load"  # empty: unset
    monkeypatch.setenv("SGLANG_CP_L3_COLD_START", "warm")
    with pytest.raises(L3ConfigError, match="cold_start: unknown mode 'warm' from SGLANG_CP_L3_COLD_START"):
        L3Config.from_dict(_base(tmp_path))


def test_ack_and_wait_defaults_are_write_behind_with_a_bounded_wait(tmp_path):
    c = L3Config.from_dict(_base(tmp_path))
    assert (c.ack, c.wait_ms) == ("write_behind", 5000)
    c = L3Config.from_dict(_base(tmp_path, ack="durable", queues={"wait_ms": 100}))
    assert (c.ack, c.wait_ms) == ("durable", 100)
    assert L3Config.from_dict(_base(tmp_path, queues={"wait_ms": 0})).wait_ms == 0  # the old drop


def test_load_once_parses_a_file_once_per_process_and_again_when_it_changes(tmp_path, monkeypatch):
    """One launch loads its config once (issue 23, item 4): the flag validation, the flag translation, the backend
    and doctor of one process share one parse; an edited file or another env override is parsed again."""
    path = tmp_path / "l3.toml"
    path.write_text(example_config(str(tmp_path / "d")))
    calls = []
    real = L3Config._parse.__func__

    def counting(cls, raw, p):
        calls.append(p)
        return real(cls, raw, p)

    monkeypatch.setattr(L3Config, "_parse", classmethod(counting))
    first = L3Config.load_once(str(path))
    assert L3Config.load_once(str(path)) is first and len(calls) == 1
    path.write_text(example_config(str(tmp_path / "d")).replace('cold_start = "clear"', 'cold_start = "load"'))
    assert L3Config.load_once(str(path)).cold_start == "load" and len(calls) == 2
    monkeypatch.setenv("SGLANG_CP_L3_COLD_START", "clear")
    assert L3Config.load_once(str(path)).cold_start == "clear" and len(calls) == 3


def test_the_test_only_write_delay_is_read_with_the_config_and_checked(tmp_path, monkeypatch):
    assert L3Config.from_dict(_base(tmp_path)).test_write_delay_ms == 0
    monkeypatch.setenv("SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS", "250")
    c = L3Config.from_dict(_base(tmp_path))
    assert c.test_write_delay_ms == 250 and c == L3Config.from_dict(_base(tmp_path))
    for bad in ("-1", "soon", "60001"):
        monkeypatch.setenv("SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS", bad)
        with pytest.raises(L3ConfigError, match="SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS"):
            L3Config.from_dict(_base(tmp_path))


def test_layer_first_gil_pause_is_off_by_default_and_takes_page_a_size_or_off(tmp_path):
    """queues.layer_first_gil_pause: when a layer-first checksum gives the GIL up (disk/format.py checksum_views):
    "off" / 0 (never: the default, each pause costs CPU), "page" (at each page's end only), a size (also every that
    many bytes)."""
    from sglang_glm_ext.l3.config import GIL_PAUSE_PAGE

    def pause(v):
        return L3Config.from_dict(_base(tmp_path, queues={"layer_first_gil_pause": v})).layer_first_gil_pause_bytes

    assert L3Config.from_dict(_base(tmp_path)).layer_first_gil_pause_bytes == 0
    assert pause("page") == GIL_PAUSE_PAGE
    assert GIL_PAUSE_PAGE > 2**40  # more than any page: only the page-end pause fires
    assert pause("1MiB") == 2**20 and pause(65536) == 65536 and pause("1GiB") == 2**30
    for off in ("off", 0, "0"):
        assert pause(off) == 0


def test_read_coalesce_bytes_defaults_to_8_mib_and_0_reads_a_page_at_a_time(tmp_path):
    """queues.read_coalesce_bytes: how many bytes of adjacent slots one reload read may cover (engine/reload.py,
    Reloader.units): 8 MiB unless set, a size string or 0 (a read a page) accepted."""
    assert L3Config.from_dict(_base(tmp_path)).read_coalesce_bytes == 8 * 2**20
    assert L3Config.from_dict(_base(tmp_path, queues={"read_coalesce_bytes": "2MiB"})).read_coalesce_bytes == 2**21
    for off in (0, "0"):
        assert L3Config.from_dict(_base(tmp_path, queues={"read_coalesce_bytes": off})).read_coalesce_bytes == 0
