"""The package's import rules (docs_internal/architecture.md): folders import downwards only, and feature cores
import no SGLang internals at import time.

Layers, bottom up: `declare` (the vocabulary, standard library only); `patching` (apply/verify machinery);
the feature folders; `plugin` (machinery on top of the features); the faces `cli` and `__init__`.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

PKG = pathlib.Path(__file__).resolve().parents[1] / "sglang_glm_ext"
FEATURE_FOLDERS = ("cuda_graph_mem", "host_register", "hugepages", "l3", "megamoe", "cpu_serve", "gpu_bringup", "host_dedup")
# The one import across feature folders: the demo's CPU stand-in installer binds the CPU serving mode's torch copies
# (a pure module that imports nothing of the package), instead of a second copy of them.
# The GPU bring-up tier's hooks serve the same tiny models with the same seeded weights and perturbed loads as the
# CPU serving mode: they call its pure modules rather than keep copies.
CROSS_FEATURE = {("sglang_glm_ext.l3.demo.cpu_standins", "sglang_glm_ext.cpu_serve.kernels"),
                 ("sglang_glm_ext.gpu_bringup.hooks", "sglang_glm_ext.cpu_serve.kernels"),
                 ("sglang_glm_ext.gpu_bringup.hooks", "sglang_glm_ext.cpu_serve.tiny_model")}

# What each part of the package may import from the package (imports inside functions count too).
ALLOWED = {
    "declare": set(),
    "patching": {"declare"},
    **{f: {"declare"} for f in FEATURE_FOLDERS},
    "plugin": {"declare", "patching", *FEATURE_FOLDERS},
    "cli": {"plugin"},
    "__init__": {"plugin"},
}


def _part(module: str) -> str:
    """'sglang_glm_ext.l3.engine.store' -> 'l3'; 'sglang_glm_ext' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path, *, import_time_only: bool) -> set[str]:
    """Absolute module names `path` imports (relative imports resolved). With import_time_only, imports inside a
    function body are left out: they run at call time, not when the module is imported."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    out: set[str] = set()

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if not (import_time_only and inside):
                if isinstance(child, ast.Import):
                    out.update(a.name for a in child.names)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")
                        base = base[: len(base) - child.level + 1]
                        stem = ".".join(base + ([child.module] if child.module else []))
                    else:
                        stem = child.module or ""
                    for alias in child.names:
                        # `from . import envs` imports the module envs; `from .flags import get` imports flags
                        sub = f"{stem}.{alias.name}"
                        out.add(sub if _own_modules({sub}) else stem)
            visit(child, inside)

    visit(tree, False)
    return out


def _own_modules(names: set[str]) -> set[str]:
    """Keep the names that are modules or packages of sglang_glm_ext (drop imported functions and classes)."""
    out = set()
    for name in names:
        if name != "sglang_glm_ext" and not name.startswith("sglang_glm_ext."):
            continue
        rel = pathlib.Path(*name.split(".")[1:]) if "." in name else pathlib.Path()
        if (PKG / rel).with_suffix(".py").is_file() or (PKG / rel / "__init__.py").is_file():
            out.add(name)
    return out


def _sources():
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_folder_imports_only_what_its_layer_allows():
    broken = []
    for path in _sources():
        here = _part(_module_name(path))
        for target in _own_modules(_imports(path, import_time_only=False)):
            there = _part(target)
            if there != here and there not in ALLOWED[here] and (_module_name(path), target) not in CROSS_FEATURE:
                broken.append(f"{path.relative_to(PKG.parent)} imports {target} ({here} -> {there})")
    assert not broken, "imports against the layering:\n" + "\n".join(broken)


# The rooms of l3/ (docs_internal/architecture.md, "The L3 rooms"), bottom up: the leaves config / errors; disk (the
# on-disk format, slab files and reads, host layouts, disk checks); engine (the store and its threads); hicache
# (SGLang's storage backend: plan, data path, keys, CP writers, metrics) and tools (fsck, bench) beside it; the
# feature files at l3's top (feature, launch, patches, hooks, doctor, cli); demo (the demo and its CPU stack) on top.
L3_ROOMS = {
    "leaf": set(),
    "disk": {"leaf"},
    "engine": {"leaf", "disk"},
    "hicache": {"leaf", "disk", "engine"},
    "feature": {"leaf", "disk", "engine", "hicache", "tools"},
    "tools": {"leaf", "disk", "engine"},
    "demo": {"leaf", "disk", "engine", "hicache", "tools", "feature"},
}
L3_LEAVES = {"config", "config_table", "errors", "__init__"}
L3_FEATURE_FILES = {"feature", "launch", "patches", "hooks", "doctor", "cli"}


def _l3_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["sglang_glm_ext", "l3"]:
        return None
    head = parts[2] if len(parts) > 2 else "__init__"
    if head in L3_LEAVES:
        return "leaf"
    if head in L3_FEATURE_FILES:
        return "feature"
    assert head in L3_ROOMS, f"{module}: a module at l3's top that is no feature file and no leaf"
    return head


def test_the_l3_rooms_import_downwards_only():
    broken = []
    for path in _sources():
        here = _l3_room(_module_name(path))
        if here is None:
            continue
        for target in _own_modules(_imports(path, import_time_only=False)):
            there = _l3_room(target)
            if there is not None and there != here and there not in L3_ROOMS[here]:
                broken.append(f"{path.relative_to(PKG.parent)} imports {target} ({here} -> {there})")
    assert not broken, "imports against the L3 rooms:\n" + "\n".join(broken)


def test_the_allowed_folder_graph_has_no_circle():
    seen: dict[str, int] = {}

    def depth(part, trail=()):
        assert part not in trail, f"circle: {' -> '.join(trail + (part,))}"
        if part not in seen:
            seen[part] = 1 + max((depth(d, trail + (part,)) for d in ALLOWED[part]), default=0)
        return seen[part]

    for part in ALLOWED:
        depth(part)


def test_no_modules_import_each_other_in_a_circle():
    # Within a folder too (imports inside functions count): a name two modules share lives in a module both import.
    graph = {_module_name(p): _own_modules(_imports(p, import_time_only=False)) - {_module_name(p)}
             for p in _sources()}
    done: set[str] = set()

    def walk(module, trail):
        assert module not in trail, f"circle: {' -> '.join(trail[trail.index(module):] + [module])}"
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            walk(target, trail + [module])
        done.add(module)

    for module in sorted(graph):
        walk(module, [])


def test_declare_imports_only_the_standard_library_at_import_time():
    names = _imports(PKG / "declare.py", import_time_only=True)
    assert all(n.split(".")[0] in sys.stdlib_module_names for n in names), names


# The SGLang side of a feature, which may import SGLang at import time: every hooks.py (a folder's own or a
# sub-folder's), and a class SGLang instantiates by module path that must subclass SGLang's base when its module is
# imported (the HiCache storage backend: SGLang's `dynamic` factory imports it by name, only when L3 is on).
SGLANG_SIDE = {"sglang_glm_ext.l3.hicache.backend"}


def _feature_cores(folder: str) -> list[pathlib.Path]:
    """Every module of a feature folder and its sub-folders, but its SGLang side (see SGLANG_SIDE)."""
    return [p for p in sorted((PKG / folder).rglob("*.py"))
            if "__pycache__" not in p.parts and p.name != "hooks.py" and _module_name(p) not in SGLANG_SIDE]


def test_sub_folders_belong_to_their_feature_folder():
    # A sub-folder (l3/hicache/, l3/tools/) is part of its feature: the same import rules, the same core rule.
    assert _part("sglang_glm_ext.l3.hicache.backend") == "l3"
    assert any(p.parent.name == "hicache" for p in _feature_cores("l3"))


def test_feature_cores_import_no_sglang_at_import_time_statically():
    # hooks.py is the thin SGLang side of a feature; every other module of a feature folder is its core.
    offenders = []
    for folder in FEATURE_FOLDERS:
        for path in _feature_cores(folder):
            bad = {n for n in _imports(path, import_time_only=True) if n == "sglang" or n.startswith("sglang.")}
            if bad:
                offenders.append(f"{path.relative_to(PKG.parent)}: {sorted(bad)}")
    assert not offenders, offenders


def test_importing_feature_cores_and_the_registry_loads_no_sglang():
    # The same rule, transitively: a fresh interpreter imports every feature core (and the registry that
    # register() reads in every SGLang process) and must end with no SGLang module loaded.
    cores = [_module_name(p) for f in FEATURE_FOLDERS for p in _feature_cores(f)]
    code = (
        "import importlib, json, sys\n"
        f"for m in {cores + ['sglang_glm_ext.plugin.registry']!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_importing_the_package_face_is_cheap():
    # SGLang imports the entry point in every process; the package face must not pull torch or SGLang.
    code = (
        "import json, sys, sglang_glm_ext\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []
