"""The start-up line (the plugin's version and its patch count) reaches stderr in a launch at SGLang's default log
level: in the launching process register() runs before SGLang configures logging (root still at WARNING), and in a
process whose logging SGLang configured at info (a scheduler) it is an INFO line."""

import re

import pytest

pytestmark = pytest.mark.slow  # a process per case

LINE = re.compile(r"sglang-glm-ext \S+: \d+/\d+ patches applied on ")

LAUNCHER = """
import sglang.launch_server  # what `python -m sglang.launch_server` has imported when it calls load_plugins()
from sglang.srt.plugins import load_plugins
load_plugins()
"""

CONFIGURED = """
import logging, sys
logging.basicConfig(level=getattr(logging, sys.argv[1].upper()), force=True)  # as SGLang's configure_logger
from sglang.srt.plugins import load_plugins
load_plugins()
"""


def _stderr(sglang_python, code, argv=()):
    proc = sglang_python.run(code=code, argv=list(argv), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_the_launching_process_shows_it_before_sglang_configures_logging(sglang_python):
    assert LINE.search(_stderr(sglang_python, LAUNCHER))


@pytest.mark.parametrize("level, shown", [("info", True), ("error", False)])
def test_a_process_sglang_configured_shows_it_at_info_and_hides_it_below_warning(sglang_python, level, shown):
    err = _stderr(sglang_python, CONFIGURED, [level])
    assert bool(LINE.search(err)) == shown
    if shown:
        assert "INFO:sglang_glm_ext:sglang-glm-ext" in err  # INFO where INFO is shown, not a warning
