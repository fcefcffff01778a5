"""What an operator reads when an L3 config is wrong: no placeholder (`<file>`, `<path>`, `<root>`) and no Python repr
(a tuple, `<class 'str'>`, `typing.Mapping`, `NoneType`) in any message; an unknown key or value names the nearest
known one when it is a slip (difflib), and guesses nothing for another word; a message about the file as a whole
gets the file's path once, from whoever names the file (`l3 fsck`, `l3 ls`, `--cp-l3-config`)."""

from __future__ import annotations

import json
import re

import pytest

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.l3 import doctor
from sglang_glm_ext.l3.config import L3Config, L3ConfigError
from sglang_glm_ext.plugin.cli import main

# A placeholder, a type's repr, a tuple's repr.
PYTHONISH = re.compile(r"<file>|<path>|<root>|<dict>|<class |typing\.|NoneType|\('")


def base(**over):
    return {"disks": [{"path": "/x/d0", "budget": "1GiB"}], "index": {"path": "/x/idx"}, **over}


def message(data) -> str:
    with pytest.raises(L3ConfigError) as e:
        L3Config.from_dict(data)
    return str(e.value)


BAD = [base(index=None), base(gc="x"), base(queues=True), base(queues={"layer_first_reads": True}),
       base(require_plp="yes"), base(plp="maybe"), base(cold_start="warm"), base(ack="eventually"),
       base(index={"path": "/x/i", "check": "paranoid"}), base(index={"path": "/x/i", "on_damage": "refuse"}),
       base(writers={"mode": "everyone"}), base(ranks={"mapping": "round_robin"}), base(payload_split="x"),
       base(disks="x"), base(disks=["x"]), base(bogus=1), base(queues={"bogus": 1}), [], "x", None]


@pytest.mark.parametrize("data", BAD, ids=lambda d: json.dumps(d)[:60])
def test_no_placeholder_and_no_python_repr_in_a_message(data):
    text = message(data)
    assert not PYTHONISH.search(text), text


def test_a_mode_lists_its_choices_as_a_config_file_spells_them():
    assert message(base(plp="maybe")) == "plp: unknown value 'maybe' (expected one of 'auto', 'assume_safe', " \
                                         "'assume_unsafe')"
    assert message(base(index=None)) == "index: expected table, got null"
    assert message(base(queues={"layer_first_reads": True})) == "queues.layer_first_reads: expected str, got a boolean"
    assert message([]) == "expected a table at the top level (a JSON object), got list"


@pytest.mark.parametrize("data,hint", [
    (base(cold_star="load"), "cold_star: unknown key; did you mean 'cold_start'?"),
    (base(queues={"wait_m": 5}), "queues.wait_m: unknown key; did you mean 'wait_ms'?"),
    (base(index={"path": "/x/i", "map_sise": "1GiB"}), "index.map_sise: unknown key; did you mean 'map_size'?"),
    ({"disks": [{"path": "/x/d", "budgte": 1}], "index": {"path": "/x/i"}},
     "disks[0].budgte: unknown key; did you mean 'budget'?"),
    ({"disk": [{"path": "/x/d", "budget": 1}], "index": {"path": "/x/i"}}, "disk: unknown key; did you mean 'disks'?"),
    (base(plp="asume_safe"), "plp: unknown value 'asume_safe'; did you mean 'assume_safe'?"),
    (base(cold_start="laod"), "cold_start: unknown mode 'laod'; did you mean 'load'?"),
    (base(ranks={"mapping": "balance"}), "ranks.mapping: unknown mapping 'balance'; did you mean 'balanced'?"),
    (base(payload_split="weight"), "payload_split: unknown rule 'weight'; did you mean 'weights'?"),
    (base(payload_split="weights", payload_weights={"target_k": 1}),
     "payload_weights.target_k: unknown payload kind; did you mean 'target_kv'?"),
])
def test_a_slip_names_the_nearest_known_key_or_value(data, hint):
    text = message(data)
    assert text.startswith(hint), text
    assert "(known:" in text or "(expected" in text or "(use" in text, text  # the whole list still follows


@pytest.mark.parametrize("data", [base(bogus=1), base(queues={"speed": 1}), base(plp="maybe"),
                                  base(index={"path": "/x/i", "on_damage": "refuse"})])
def test_another_word_gets_no_guess(data):
    assert "did you mean" not in message(data)


def _files(tmp_path):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[[disks]\n")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    return {"cannot read the L3 config: No such file or directory": tmp_path / "missing.toml",
            "not valid TOML: ": bad_toml, "not valid JSON: ": bad_json,
            "expected a table at the top level": listed}


def test_a_file_level_message_starts_with_what_is_wrong(tmp_path):
    for start, path in _files(tmp_path).items():
        with pytest.raises(L3ConfigError) as e:
            L3Config.from_file(path)
        assert str(e.value).startswith(start) and str(path) not in str(e.value), str(e.value)


@pytest.mark.parametrize("tool", ["fsck", "ls"])
def test_the_l3_tools_name_the_file_once(tmp_path, capsys, tool):
    for start, path in _files(tmp_path).items():
        assert main(["l3", tool, str(path)]) == 16
        err = capsys.readouterr().err
        assert err.startswith(f"l3 {tool}: {path}: {start}") and err.count(str(path)) == 1, err
        assert not PYTHONISH.search(err), err


def test_the_launch_check_names_the_file_once(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[disks]\n")
    values = {"enable_cp_l3": True, "cp_l3_config": str(bad)}
    (problem,) = doctor.report(DoctorInput(values, (), {})).problems
    assert problem.startswith(f"--cp-l3-config {bad}: not valid TOML: "), problem
    assert problem.count(str(bad)) == 1 and not PYTHONISH.search(problem), problem
