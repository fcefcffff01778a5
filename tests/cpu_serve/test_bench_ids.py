"""The served bench's output-id check across sides (benchmark/cpu_server_bench.py): the storage sides' ids after the
restart must come out equal when both tiers hand back the same KV, and a single flipped token in the L3 side must show.
Pure: built from replies, no server (the bench itself runs the servers; its GPU output is in docs_internal)."""

import importlib.util
import os
import sys

from sglang_glm_ext.cpu_serve.served import Reply

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmark", "cpu_server_bench.py")
_spec = importlib.util.spec_from_file_location("cpu_server_bench", BENCH)
bench = importlib.util.module_from_spec(_spec)
_path = list(sys.path)
try:
    _spec.loader.exec_module(bench)
finally:
    sys.path[:] = _path  # the script puts the repo root first on sys.path for its own runs; the suite's stays as it was


def _r(ids, storage=0, device=0):
    return Reply(100, list(ids), {"device": device, "host": 0, "storage": storage}, 0.1, 0.2)


def _runs():
    cold = [_r([1, 2, 3]), _r([4, 5, 6])]
    hit = [_r([1, 2, 9], storage=64), _r([4, 5, 6], device=64)]
    replay = [_r([1, 2, 9], storage=64), _r([4, 5, 6], storage=64)]
    return {name: {"first": list(cold), "restart": list(hit) if name != "a_hicache" else list(cold),
                   "storage_replay": list(replay) if name != "a_hicache" else list(cold)}
            for name in ("a_hicache", "b_file", "c_l3")}


def test_equal_ids_across_sides_read_true_with_the_same_hits():
    rows = bench.ids_across_sides(_runs())
    assert [label for label, _, _ in rows] == ["first pass b_file = a_hicache", "first pass c_l3 = a_hicache",
                                               "restart c_l3 = b_file", "storage replay c_l3 = b_file"]
    assert all(equal and same for _, equal, same in rows)


def test_one_flipped_token_in_the_l3_side_after_the_restart_shows():
    runs = _runs()
    runs["c_l3"]["storage_replay"][1] = _r([4, 5, 7], storage=64)
    rows = {label: (equal, same) for label, equal, same in bench.ids_across_sides(runs)}
    assert rows["storage replay c_l3 = b_file"] == (False, True)
    assert rows["restart c_l3 = b_file"] == (True, True)


def test_different_hits_are_named_and_a_cut_side_compares_only_what_finished():
    runs = _runs()
    runs["c_l3"]["restart"][1] = _r([4, 5, 6], storage=64)  # from storage where file's came from the device
    del runs["c_l3"]["storage_replay"][1:]  # a deadline cut the L3 side's storage replay after one request
    del runs["b_file"]["first"]
    rows = {label: (equal, same) for label, equal, same in bench.ids_across_sides(runs)}
    assert rows["restart c_l3 = b_file"] == (True, False)
    assert rows["storage replay c_l3 = b_file"] == (True, True)
    assert "first pass b_file = a_hicache" not in rows
