"""docs/grafana/sglang_glm_ext.json: a dashboard Grafana's own dashboard schema accepts (vendored under
docs/grafana/schema/, source in its NOTICE), whose every query names metrics the plugin registers with labels they
carry, covering the L3 tier (its latency histograms included) and MegaMoE's miss counters."""

import json
import pathlib
import re

import jsonschema
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "sglang_glm_ext.json"
SCHEMA = ROOT / "docs" / "grafana" / "schema" / "dashboard.jsonschema.json"
_METRIC = re.compile(r"sglang:[A-Za-z0-9_:]+")


def known_metrics() -> dict[str, set[str]]:
    """Every series name the plugin exports -> the labels it carries."""
    from sglang_glm_ext.l3.hicache import metrics
    from sglang_glm_ext.megamoe import miss

    out = {n: {"layer_kind", "reason"} for n, _ in miss.PROM_COUNTERS}
    for m in metrics.METRICS:
        labels = set(m.base) | set(m.labels)
        if m.type == "histogram":
            out.update({f"{m.name}_bucket": labels | {"le"}, f"{m.name}_sum": labels, f"{m.name}_count": labels})
        else:
            out[m.name] = labels
    return out


def _validator():
    schema = json.loads(SCHEMA.read_text())
    return jsonschema.Draft7Validator(schema)


def _panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def _queries(dash):
    for p in _panels(dash):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]
    for v in dash["templating"]["list"]:
        if isinstance(v.get("query"), str) and v["type"] == "query":
            yield v["name"], v["query"]


def test_grafanas_dashboard_schema_accepts_it():
    errors = sorted(_validator().iter_errors(json.loads(DASHBOARD.read_text())), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


@pytest.mark.parametrize("break_it", [
    lambda d: d.pop("templating"),
    lambda d: d["panels"][1].update(gridPos={"h": 8, "w": 30, "x": 0, "y": 0}),
    lambda d: d["panels"][1].update(query="not a panel field"),
])
def test_the_schema_refuses_a_broken_dashboard(break_it):
    dash = json.loads(DASHBOARD.read_text())
    break_it(dash)
    assert list(_validator().iter_errors(dash))


def test_every_query_names_registered_metrics_with_their_labels():
    known = known_metrics()
    problems = []
    for where, expr in _queries(json.loads(DASHBOARD.read_text())):
        names = _METRIC.findall(expr)
        problems += [f"{where}: no metric in {expr}"] if not names else []
        problems += [f"{where}: unknown metric {n}" for n in names if n not in known]
        for name, matchers in re.findall(r"(sglang:[A-Za-z0-9_:]+)\{([^}]*)\}", expr):
            problems += [f"{where}: {name} has no label {lab}"
                         for lab in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!=|!~|=)", matchers)
                         if lab not in known.get(name, set())]
        problems += [f"{where}: unbalanced brackets in {expr}" for o, c in ("()", "[]", "{}")
                     if expr.count(o) != expr.count(c)]
    assert not problems, problems


def test_it_covers_the_l3_tier_its_latencies_and_megamoe():
    from sglang_glm_ext.l3.engine import latency

    names = {n for _, e in _queries(json.loads(DASHBOARD.read_text())) for n in _METRIC.findall(e)}
    assert {f"sglang:cp_l3_{k}_latency_seconds_bucket" for k in latency.KINDS} <= names
    assert {"sglang:megamoe_miss_layer_batches_total", "sglang:megamoe_miss_tokens_total"} <= names
    assert {"sglang:cp_l3_gc_reclaimed_total", "sglang:cp_l3_used_slots", "sglang:cp_l3_staging_limit_bytes"} <= names
    assert not names & {"sglang:cp_l3_dropped_writes_total", "sglang:cp_l3_reload_from_staging_total"}  # deprecated


def test_panel_ids_are_unique_and_panels_do_not_overlap():
    panels = list(_panels(json.loads(DASHBOARD.read_text())))
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        cells |= mine
