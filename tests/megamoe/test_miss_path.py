"""The MegaMoE miss path (issue 26) over gloo, through SGLang's real GLM-4.x block and GLM-5.x's DeepseekV2MoE
(harness: miss_harness.py; what is real and what is faked is listed there).

Every rank's batch has a different size (DP attention's all-gathered counts), some ranks above the cap, some idle.
What it proves, for 2 and 4 ranks (tp = ep = world):
- a batch within the cap on every rank takes the kernel on every rank (fake DeepGEMM's dispatch and combine);
- a batch above the cap on any rank takes the gathered miss path on every rank (no rank left in a collective the
  others skip), idle ranks included, with even and uneven counts;
- each rank's rows equal a single-process reference computed on the whole batch, from the checkpoint;
- the miss ran this rank's experts through SGLang's own FP8 runner on all the gathered rows, on the [gate; up]
  layout, and left w13 interleaved for the kernel again (the next hit is right);
- capture takes the kernel; a layer whose MegaMoE weights are not ready misses on every batch, under capture too
  (without the count all-gather, whose host read a graph cannot hold);
- misses are counted per layer kind and reason;
- a run that hangs fails on a timeout (the rank processes are bounded, and gloo collectives time out after 60 s).

Each rank is its own process, forked from a zygote that imported SGLang once (gloo_ranks.py).
"""

from __future__ import annotations

import pytest

from glm_configs import write_model_dir
from gloo_ranks import run_ranks, zygote

TIMEOUT_S = 420

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harness_zygote():
    with zygote() as z:
        yield z


@pytest.fixture(scope="module", params=[("glm4", 2), ("glm5", 4)],
                ids=["glm4-2ranks", "glm5-4ranks"])  # (glm4 at 4 and glm5 at 2 ranks pass too; kept out for time)
def ranks(request, tmp_path_factory, harness_zygote):
    kind, world = request.param
    tmp = tmp_path_factory.mktemp(f"miss_{kind}_{world}")
    model = write_model_dir(tmp / "model")
    return run_ranks(harness_zygote, tmp, "miss_harness.py",
                     lambda r, port: [kind, str(world), str(r), port, model, str(tmp / f"rank{r}.json")], world,
                     TIMEOUT_S)


def test_layout_and_fallback(ranks):
    for r, res in enumerate(ranks):
        assert res["parallel"]["ep"] == len(ranks) and res["parallel"]["ep_rank"] == r
        assert res["interleaved_at_load"] and res["fallback"] == "sm90_relayout" and res["load_check"] == []
        assert res["shared_rows"] == 256  # replicated (2I), not TP-sharded


HITS = ["hit_uneven", "hit_after_misses", "capture_takes_the_kernel"]
MISSES = ["miss_one_rank_over_cap", "miss_only_one_rank_busy", "miss_even", "not_ready", "not_ready_capture"]


@pytest.mark.parametrize("run", HITS + MISSES)
def test_every_rank_takes_the_same_path_and_matches_the_whole_batch_reference(ranks, run):
    paths = set()
    for res in ranks:
        entry = res["runs"][run]
        assert entry["outcome"] == "ok", entry
        path = ("kernel" if entry["kernel_calls"] == 1 and entry["miss_calls"] == 0 else
                "miss" if entry["miss_calls"] == 1 and entry["kernel_calls"] == 0 else "mixed")
        paths.add(path)
        rows = entry["rows"][res["rank"]]
        assert entry["y_shape"] == [rows, 256]
        if rows:
            assert entry["rel_err"] < 2e-2, (res["rank"], entry)  # bf16 outputs of fp32 math
        assert entry["layout_restored"], entry
    assert paths == {"kernel" if run in HITS else "miss"}, paths


def test_a_miss_runs_this_ranks_experts_on_every_gathered_row(ranks):
    for res in ranks:
        for run in MISSES:
            entry = res["runs"][run]
            assert entry["runner_rows"] == [sum(entry["rows"])], entry  # SGLang's runner, once, on all rows
        for run in HITS:
            assert res["runs"][run]["runner_rows"] == []


def test_a_captured_miss_makes_no_count_all_gather(ranks):
    for res in ranks:
        assert res["runs"]["not_ready_capture"]["count_all_gathers"] == 0


def test_misses_are_counted_per_layer_kind_and_reason(ranks):
    for res in ranks:
        kind = res["kind"]
        c = res["counters"]
        assert c[f"{kind}/over_cap"]["batches"] == 3 and c[f"{kind}/not_ready"]["batches"] == 2
        mine = res["rank"]
        want = sum(res["runs"][r]["rows"][mine] for r in MISSES if not r.startswith("not_ready"))
        assert c[f"{kind}/over_cap"]["tokens"] == want
