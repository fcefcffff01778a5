"""docs/prometheus/alerts.yml: a Prometheus rule file whose every expression names metrics the plugin registers, with
labels those metrics carry, and parses at the level of balanced brackets and known PromQL functions. promtool is not
installable here (no Go toolchain, no binary downloads); where it is on PATH, `promtool check rules` runs too."""

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus" / "alerts.yml"

FUNCTIONS = {"rate", "irate", "increase", "delta", "histogram_quantile", "max_over_time", "min_over_time",
             "avg_over_time", "abs", "clamp_min", "clamp_max", "absent", "sum", "max", "min", "avg", "count",
             "topk", "bottomk"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool"}
_METRIC = re.compile(r"sglang:[A-Za-z0-9_:]+")
_DURATION = re.compile(r"^\d+[smhdw]$")


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


def rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def expression_problems(expr: str, known: dict[str, set[str]]) -> list[str]:
    problems = []
    bare = re.sub(r'"[^"]*"', '""', expr)
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in bare:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            problems.append(f"unbalanced {ch!r}")
    problems += [f"unclosed {c!r}" for c in stack]
    names = _METRIC.findall(bare)
    if not names:
        problems.append("names no metric")
    all_labels = set().union(*known.values()) | {"le"}
    for name in names:
        if name not in known:
            problems.append(f"unknown metric {name}")
    for name, matchers in re.findall(r"(sglang:[A-Za-z0-9_:]+)\{([^}]*)\}", expr):
        for label in re.findall(r"([A-Za-z_]+)\s*(?:=~|!=|!~|=)", matchers):
            if label not in known.get(name, set()):
                problems.append(f"{name} has no label {label}")
    for word in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.sub(_METRIC, "", bare)):
        if word not in FUNCTIONS | KEYWORDS:
            problems.append(f"unknown function {word}")
    for group in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", bare):
        problems += [f"unknown label {x}" for x in re.split(r"\s*,\s*", group.strip()) if x and x not in all_labels]
    problems += [f"bad range [{r}]" for r in re.findall(r"\[([^\]]*)\]", bare) if not _DURATION.match(r)]
    return problems


def test_every_rule_is_complete_and_its_expression_names_registered_metrics():
    known = known_metrics()
    seen = set()
    all_labels = set().union(*known.values())
    for r in rules():
        name = r["alert"]
        assert name not in seen, f"{name} twice"
        seen.add(name)
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, name
        assert r["labels"]["severity"] in {"info", "warning", "critical"}, name
        assert r["annotations"]["summary"] and r["annotations"]["description"], name
        assert "for" not in r or _DURATION.match(r["for"]), name
        assert not expression_problems(r["expr"], known), (name, expression_problems(r["expr"], known))
        text = r["annotations"]["summary"] + r["annotations"]["description"]
        assert set(re.findall(r"\$labels\.([A-Za-z0-9_]+)", text)) <= all_labels, name
    assert len(seen) >= 10


def test_the_l3_tier_and_megamoe_both_have_alerts():
    names = {n for r in rules() for n in _METRIC.findall(r["expr"])}
    assert any(n.startswith("sglang:cp_l3_") for n in names)
    assert any(n.startswith("sglang:megamoe_miss_") for n in names)
    # the disk's health is alerted on by its latency too, not only by its error counters
    assert {"sglang:cp_l3_fdatasync_latency_seconds_bucket", "sglang:cp_l3_write_path_failing"} <= names


@pytest.mark.parametrize("expr, wrong", [
    ("rate(sglang:cp_l3_spill_pages_total[5m] > 0", "unclosed '('"),
    ("rate(sglang:cp_l3_no_such_metric_total[5m]) > 0", "unknown metric sglang:cp_l3_no_such_metric_total"),
    ('sglang:cp_l3_dropped_pages_total{cp_rank="0"} > 0', "sglang:cp_l3_dropped_pages_total has no label cp_rank"),
    ("rat(sglang:cp_l3_spill_pages_total[5m]) > 0", "unknown function rat"),
    ("rate(sglang:cp_l3_spill_pages_total[5 m]) > 0", "bad range [5 m]"),
])
def test_the_checker_catches_what_it_promises_to(expr, wrong):
    assert wrong in expression_problems(expr, known_metrics())


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed here")
def test_promtool_accepts_the_rules():
    subprocess.run(["promtool", "check", "rules", str(RULES)], check=True)
