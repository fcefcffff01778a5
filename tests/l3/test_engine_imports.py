"""The L3 engine imports neither SGLang nor torch at import time, so it runs next to any torch version (and in
tools, fsck and bench on machines without either). Checked in a fresh interpreter that imports every module of
sglang_glm_ext/l3/ and l3/tools/ (feature wiring that talks to SGLang lives in its own subfolders)."""

import json
import pathlib
import subprocess
import sys

PKG = pathlib.Path(__file__).resolve().parents[2] / "sglang_glm_ext"


def _engine_modules() -> list[str]:
    files = sorted((PKG / "l3").glob("*.py")) + sorted((PKG / "l3" / "tools").glob("*.py"))
    names = []
    for f in files:
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def test_importing_every_engine_module_loads_neither_sglang_nor_torch():
    mods = _engine_modules()
    assert "sglang_glm_ext.l3.store" in mods and "sglang_glm_ext.l3.tools.fsck" in mods
    code = (
        "import importlib, json, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=str(PKG.parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []
