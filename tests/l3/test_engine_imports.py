"""The L3 engine imports neither SGLang nor torch at import time, so it runs next to any torch version (and in
tools, fsck and bench on machines without either). Checked in a fresh interpreter that imports every module of
l3/engine/, l3/disk/, l3/tools/ and the feature files at l3's top (the rooms that talk to SGLang or torch are
l3/hicache/ and l3/demo/)."""

import json
import pathlib
import subprocess
import sys

PKG = pathlib.Path(__file__).resolve().parents[2] / "sglang_glm_ext"


def _engine_modules() -> list[str]:
    files = [f for room in ("", "engine", "disk", "tools") for f in sorted((PKG / "l3" / room).glob("*.py"))]
    names = []
    for f in files:
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def test_importing_every_engine_module_loads_neither_sglang_nor_torch():
    mods = _engine_modules()
    assert {"sglang_glm_ext.l3.engine.store", "sglang_glm_ext.l3.disk.slab_reader", "sglang_glm_ext.l3.tools.fsck",
            "sglang_glm_ext.l3.feature", "sglang_glm_ext.l3.config"} <= set(mods)
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
