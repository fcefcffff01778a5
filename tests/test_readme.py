"""The README's flag table is the generated one, and .ci/run runs the README's test command."""

import pathlib
import re

from sglang_glm_ext.plugin.docs import flags_table

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_flag_table_is_current():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- flags:begin[^\n]*-->\n(.*?)<!-- flags:end -->", text, re.S)
    assert m, "README lost its flags:begin/flags:end markers"
    assert m.group(1) == flags_table(), "README flag table is stale: paste `sglang-glm-ext flags` between the markers"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "```bash\nbash scripts/test.sh\n```" in readme
    assert re.search(r"^bash scripts/test\.sh\b", ci, re.M)
