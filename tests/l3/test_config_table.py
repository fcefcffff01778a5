"""The L3 config's key table (l3/config_table.py) is the one place a key's parser, default and doc are written: the
dataclass defaults, from_dict, the example config and docs/l3_config_reference.md all come from it."""

import dataclasses
import pathlib
import subprocess
import sys
import tomllib

import pytest

from sglang_glm_ext.l3 import config_table as table
from sglang_glm_ext.l3.config import L3Config, L3ConfigError, example_config
from sglang_glm_ext.l3.config_table import KEYS, OMIT, REQUIRED, SAME, default, reference_markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "l3_config_reference.md"
REGENERATE = "python -m sglang_glm_ext.l3.config_table --reference > docs/l3_config_reference.md"
# L3Config fields no single key fills: from_dict's explicit code sets them ([[disks]], ranks, payload_weights) or the
# caller does (source, the test-only env var).
EXPLICIT_FIELDS = {"disks", "num_ranks", "rank_to_disk", "rank_to_disks", "payload_weights", "source",
                   "test_write_delay_ms"}


def _minimal(tmp_path):
    return {"disks": [{"path": str(tmp_path / "d0"), "budget": "1GiB"}], "index": {"path": str(tmp_path / "idx")}}


def test_the_committed_reference_is_what_the_table_generates():
    assert REFERENCE.read_text() == reference_markdown(), f"{REFERENCE.name} is stale: run `{REGENERATE}`"


def test_the_reference_command_prints_the_reference():
    proc = subprocess.run([sys.executable, "-m", "sglang_glm_ext.l3.config_table", "--reference"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == reference_markdown()


def test_every_row_default_is_the_dataclass_default_and_every_field_has_a_row_or_explicit_code():
    fields = {f.name: f for f in dataclasses.fields(L3Config)}
    rows = [k for k in KEYS if k.field is not None]
    for k in rows:
        if k.default is REQUIRED:
            assert fields[k.field].default is dataclasses.MISSING, k.path
        else:
            assert fields[k.field].default == default(k.path), k.path
    assert set(fields) == {k.field for k in rows} | EXPLICIT_FIELDS
    assert len({k.path for k in KEYS}) == len(KEYS) and len({k.field for k in rows}) == len(rows)


def test_a_config_of_its_required_keys_only_gets_every_table_default(tmp_path):
    cfg = L3Config.from_dict(_minimal(tmp_path))
    for k in KEYS:
        if k.field is not None and k.default is not REQUIRED:
            assert getattr(cfg, k.field) == default(k.path), k.path
    assert (cfg.num_ranks, cfg.rank_to_disks, cfg.payload_weights) == (1, ((0,),), None)
    assert default("queues.staging_bytes") == 256 * 2**20 and default("index.map_size") == 2**30
    assert default("queues.layer_first_gil_pause") == 0 and default("ranks.count") is None


def _stated(text: str, key: table.Key):
    """The value the example config writes for ``key`` (the first [[disks]] entry's for a disks key)."""
    data = tomllib.loads(text)
    node = data
    for part in key.section.split(".") if key.section else ():
        node = node[part][0] if isinstance(node[part], list) else node[part]
    return node[key.name]


def test_the_example_config_parses_back_to_the_values_it_states(tmp_path):
    text = example_config(tmp_path)
    cfg = L3Config.from_dict(tomllib.loads(text))
    for k in KEYS:
        if k.example is OMIT:
            continue
        stated = _stated(text, k)
        want = k.default if k.example is SAME else k.example
        assert stated == (want.replace("{dir}", str(tmp_path)) if isinstance(want, str) else want), k.path
        if k.field is not None:
            assert getattr(cfg, k.field) == k.kind.parse(stated, k.path), k.path
            if k.example is SAME:
                assert getattr(cfg, k.field) == default(k.path), k.path
    assert cfg.disks[0].budget == 2**30 and cfg.num_ranks == 1 and cfg.deployment_id == "example"


def test_each_example_line_that_tools_edit_by_text_is_there_once(tmp_path):
    # tests and benchmarks patch the example by str.replace ('count = 1', 'budget = "1GiB"', '[ranks]', ...): a
    # doc that repeated such a line would be patched too.
    text = example_config(tmp_path)
    lines = text.splitlines()
    for k in KEYS:
        if k.example is not OMIT:
            line = next(ln for ln in lines if ln.startswith(f"{k.name} = "))
            assert text.count(line) == 1, line
    for header in ("[[disks]]", "[ranks]", "[writers]", "[index]", "[gc]", "[queues]"):
        assert text.count(f"\n{header}\n") == 1 and text.index(header) == text.index(f"\n{header}\n") + 1, header
    assert text.count("[ranks]") == 1 and "[[0, 1, 2, 3]]" in text and max(map(len, lines)) <= 120


@pytest.mark.parametrize("over,message", [
    ({"bogus": 1}, "bogus: unknown key (known: ack, cold_start, deployment_id, direct_io, disks, gc, index, "
                   "payload_split, payload_weights, plp, queues, ranks, require_plp, writers)"),
    ({"queues": {"bogus": 1}}, "queues.bogus: unknown key (known: staging_bytes, max_inflight, wait_ms, "
                               "write_batch_pages, io_threads, reload_threads, layer_first_reads, read_coalesce_bytes, "
                               "layer_first_gil_pause)"),
    ({"index": {"path": "/x/i", "bogus": 1}}, "index.bogus: unknown key (known: path, map_size, check, on_damage)"),
    ({"gc": {"bogus": 1}}, "gc.bogus: unknown key (known: start, stop, budget_per_round)"),
    ({"ranks": {"bogus": 1}}, "ranks.bogus: unknown key (known: count, mapping)"),
    ({"writers": {"bogus": 1}}, "writers.bogus: unknown key (known: mode)"),
    ({"disks": [{"path": "/x/d", "budget": 1, "bogus": 1}]}, "disks[0].bogus: unknown key (known: path, budget)"),
    ({"require_plp": "yes"}, "require_plp: expected bool, got str 'yes'"),
    ({"queues": {"layer_first_reads": True}}, "queues.layer_first_reads: expected str, got a boolean"),
    ({"gc": "x"}, "gc: expected table, got str 'x'"),
    ({"queues": True}, "queues: expected table, got a boolean"),
    ({"index": None}, "index: expected table, got null"),
    ({"disks": "x"}, "disks: expected list, got str 'x'"),
    ({"disks": []}, "disks: at least one disk is required"),
    ({"disks": ["x"]}, "disks[0]: expected a table with path and budget"),
    ({"disks": [{"budget": 1}]}, "disks[0].path: required key missing"),
    ({"disks": [{"path": ""}]}, "disks[0].path: empty path"),
    ({"disks": [{"path": "rel", "budget": 1}]}, "disks[0].path: relative path 'rel' needs an absolute path in a dict "
                                                "config"),
    ({"disks": [{"path": "/x/d", "budget": 1}, {"path": "/x/d", "budget": 1}]}, "disks[1].path: '/x/d' listed twice"),
    ({"index": {"path": "/x/i", "map_size": 1000}}, "index.map_size: 1000 bytes is too small (>= 1 MiB)"),
    ({"index": {"path": "/x/i", "check": "paranoid"}}, "index.check: unknown mode 'paranoid' (expected one of "
                                                       "'fast', 'full')"),
    ({"index": {"path": "/x/i", "on_damage": "refuse"}}, "index.on_damage: unknown action 'refuse' (expected one of "
                                                         "'salvage', 'reset')"),
    ({"ack": 1}, "ack: expected str, got int 1"),
    ({"plp": "maybe"}, "plp: unknown value 'maybe' (expected one of 'auto', 'assume_safe', 'assume_unsafe')"),
    ({"ranks": {"count": 2, "mapping": [0, 0, 0]}}, "ranks.mapping: has 3 entries but ranks.count = 2"),
    ({"ranks": {"mapping": []}}, "ranks.mapping: empty list"),
    ({"ranks": {"mapping": [[0, 0]]}}, "ranks.mapping[0][1]: disk 0 listed twice for this rank (each disk at most "
                                       "once per rank)"),
    ({"ranks": {"mapping": 3}}, "ranks.mapping: expected 'balanced', 'all' or a list, got int"),
    ({"gc": {"start": 0.8, "stop": 0.9}}, "gc.start: must be greater than gc.stop (0.8 <= 0.9)"),
    ({"gc": {"stop": "x"}}, "gc.stop: expected a number in (0, 1], got 'x'"),
    ({"queues": {"staging_bytes": 1.5}}, "queues.staging_bytes: expected a byte size (int or string), got float"),
    ({"queues": {"wait_ms": 600001}}, "queues.wait_ms: expected an integer in [0, 600000] (milliseconds), got 600001"),
    ({"ack": "durable", "queues": {"wait_ms": 0}}, "queues.wait_ms: ack = 'durable' answers SGLang once its pages "
                                                   "are durable, so it needs a wait (e.g. 5000); 0 would answer every "
                                                   "write as failed"),
    ({"queues": {"read_coalesce_bytes": "2GiB"}}, "queues.read_coalesce_bytes: at most 1 GiB, got 2147483648 B"),
    ({"writers": "spread"}, "writers: expected table, got str 'spread'"),
    ({"payload_split": "x"}, "payload_split: unknown rule 'x' (expected 'equal_slots' or 'weights')"),
    ({"payload_weights": {"target_kv": 1}}, "payload_weights: set payload_split = 'weights' to use weights"),
    ({"payload_split": "weights", "payload_weights": {"index_k": 0}}, "payload_weights.index_k: expected a positive "
                                                                      "number, got 0"),
])
def test_unknown_keys_and_bad_values_keep_their_messages(over, message):
    data = {"disks": [{"path": "/x/d0", "budget": "1GiB"}], "index": {"path": "/x/idx"}, **over}
    with pytest.raises(L3ConfigError) as e:
        L3Config.from_dict(data)
    assert str(e.value) == message


@pytest.mark.parametrize("data,message", [
    ({"disks": [{"path": "/x/d0", "budget": 1}]}, "index: required key missing"),
    ({"index": {"path": "/x/i"}}, "disks: required key missing"),
    ({}, "disks: required key missing"),
    ([], "expected a table at the top level (a JSON object), got list"),
])
def test_missing_tables_keep_their_messages(data, message):
    with pytest.raises(L3ConfigError) as e:
        L3Config.from_dict(data)
    assert str(e.value) == message


def test_the_index_guard_takes_its_modes_from_the_table():
    from sglang_glm_ext.l3 import config
    from sglang_glm_ext.l3.engine import index_check

    assert index_check.CHECK_MODES is table.INDEX_CHECK_MODES is config.INDEX_CHECK_MODES
    assert index_check.ON_DAMAGE is table.INDEX_ON_DAMAGE is config.INDEX_ON_DAMAGE
