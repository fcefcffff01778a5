"""The leak guard: process-wide state a test may change and must put back.

The suite runs in one process, in any order (``--random-order``): a test that leaves SGLang's parallel topology
stamped, an environment variable set, a logger silenced or a fake module in ``sys.modules`` breaks whichever test
runs after it, far from the cause. The root conftest's autouse fixture takes ``snapshot()`` before each test and
``diff()`` after it (after the test's own function-scoped fixtures are torn down), and fails that test naming what
leaked; ``restore()`` then puts the state back so the failure stays with the test that caused it. The same check
runs around each module's module-scoped fixtures (conftest hooks), blaming the module's last test.

Each ``Probe`` reads one piece of state as a plain value (a copy, never a live reference: a dict that a later
``update`` mutates would compare equal to itself). Reading SGLang or torch state never imports them: a probe of a
module not yet imported reads ``ABSENT``, and importing one during a test is not a leak.

What is deliberately not a leak (each a one-time effect of an import or a first use, the same whichever test
comes first, never a value a test chose):
- what a module does while it is imported: ``trace_imports()`` (installed by the root conftest before any test file
  is imported) records the environment variables, ``sys.path`` entries, loggers and hand-made ``sys.modules``
  entries each outermost import changes, and a value an import set is not held against the test that imported it
  first (``import sglang`` points third-party caches at SGLANG_CACHE_DIR, its scheduler module sets up logging, C
  extensions register runtime modules, setuptools appends its vendored folder to ``sys.path``);
- the plugin's registration (``register()`` is idempotent and one-way in a real process: its ledger going from None
  to a ledger is accepted, any other change is not);
- new entries in ``sys.modules`` made by an import (a module with a ``__spec__``; a package may also put plain
  objects there, as deep_gemm does) and new loggers;
- pytest's own log-capture handlers, which it swaps on the root logger between a test's phases, and its
  ``PYTEST_CURRENT_TEST``;
- what torch's compiler sets up on its first compile: its ``torch.*`` loggers (torch._logging), its compiled
  kernels' modules (``torch._inductor.*``) and its ``_TORCHINDUCTOR_*`` environment variables.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

ABSENT = object()  # the module that holds the state is not imported


def _short(v: Any, n: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def _dict_diff(before: dict, after: dict, what: str, imported: dict | None = None) -> list[str]:
    out = []
    for k in sorted(set(before) | set(after), key=str):
        if imported and k in imported and after.get(k, ABSENT) == imported[k]:  # the value an import set
            continue
        if k not in after:
            out.append(f"{what}: {k} removed (was {_short(before[k])})")
        elif k not in before:
            out.append(f"{what}: {k} added ({_short(after[k])})")
        elif not _same(before[k], after[k]):
            out.append(f"{what}: {k} {_short(before[k])} -> {_short(after[k])}")
    return out


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == raises (a tensor) is compared by identity only
        return False


@dataclass(frozen=True)
class Probe:
    name: str
    read: Callable[[], Any]
    diff: Callable[[Any, Any], list[str]]
    restore: Callable[[Any], None] | None = None


# ---- the process: environment, sys.path, cwd, umask, signals, switch interval ----

def _env_exempt(name: str) -> bool:
    return name == "PYTEST_CURRENT_TEST" or name.startswith("_TORCHINDUCTOR_")


def _environ() -> dict:
    return {k: v for k, v in os.environ.items() if not _env_exempt(k)}


def _env_restore(before: dict) -> None:
    for k in [k for k in os.environ if k not in before and not _env_exempt(k)]:
        del os.environ[k]
    os.environ.update(before)


def _path_diff(before: list, after: list) -> list[str]:
    if before == after:
        return []
    added = [p for p in after if p not in before and p not in _IMPORTED["sys.path"]]
    removed = [p for p in before if p not in after]
    if not added and not removed:
        return [] if [p for p in after if p in before] == before else ["sys.path: reordered"]
    return [f"sys.path: {p} added" for p in added] + [f"sys.path: {p} removed" for p in removed]


def _path_restore(before: list) -> None:
    sys.path[:] = before + [p for p in sys.path if p not in before and p in _IMPORTED["sys.path"]]


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


_SIGNALS = [s for s in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE")
            if hasattr(signal, s)]


def _signals() -> dict:
    return {name: signal.getsignal(getattr(signal, name)) for name in _SIGNALS}


def _signals_restore(before: dict) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for name, handler in before.items():
        if handler is not None:
            signal.signal(getattr(signal, name), handler)


def _eq_diff(name: str) -> Callable[[Any, Any], list[str]]:
    return lambda a, b: [] if _same(a, b) else [f"{name}: {_short(a)} -> {_short(b)}"]


# ---- sys.modules: a module replaced or removed, or a hand-made one added ----

# Names a runtime re-binds outside any import: Triton loads each compiled kernel's launcher as `__triton_launcher`.
RUNTIME_MODULES = frozenset({"__triton_launcher"})


def _modules() -> dict:
    return {name: m for name, m in list(sys.modules.items())}


def _hand_made(name: str, m: Any) -> bool:
    """A module object no import made (``types.ModuleType(...)`` put in ``sys.modules``): a fake left behind."""
    return isinstance(m, types.ModuleType) and getattr(m, "__spec__", None) is None and name != "__main__" \
        and not name.startswith("torch._inductor.") and name not in _IMPORTED["modules"]


def _modules_diff(before: dict, after: dict) -> list[str]:
    out = []
    for name, m in after.items():
        old = before.get(name, ABSENT)
        if old is ABSENT:
            if _hand_made(name, m):
                out.append(f"sys.modules: {name} added by hand ({_short(m)})")
        elif old is not m and _IMPORTED["replaced"].get(name) is not m and name not in RUNTIME_MODULES:
            out.append(f"sys.modules: {name} replaced ({_short(old)} -> {_short(m)})")
    out += [f"sys.modules: {name} removed" for name in before if name not in after]
    return out


def _modules_restore(before: dict) -> None:
    for name in list(sys.modules):
        if name not in before and _hand_made(name, sys.modules[name]):
            del sys.modules[name]
    for name, m in before.items():
        now = sys.modules.get(name, ABSENT)
        if now is not m and (now is ABSENT or (_IMPORTED["replaced"].get(name) is not now
                                               and name not in RUNTIME_MODULES)):
            sys.modules[name] = m


# ---- logging: every existing logger's level, handlers, propagate and disabled ----

def _own_handlers(lg: logging.Logger) -> tuple:
    # pytest's capture handlers are swapped on the root logger between a test's setup, call and teardown.
    return tuple(h for h in lg.handlers if not type(h).__module__.startswith("_pytest"))


def _loggers() -> dict:
    mgr = logging.root.manager
    out = {"<disable>": mgr.disable,
           "<root>": (logging.root.level, _own_handlers(logging.root), logging.root.propagate, logging.root.disabled)}
    for name, lg in list(mgr.loggerDict.items()):
        if isinstance(lg, logging.Logger) and name != "torch" and not name.startswith("torch."):
            out[name] = (lg.level, _own_handlers(lg), lg.propagate, lg.disabled)
    return out


def _loggers_diff(before: dict, after: dict) -> list[str]:
    out = []
    fields = ("level", "handlers", "propagate", "disabled")
    for name, old in before.items():
        new = after.get(name)
        if name == "<disable>":
            if old != new:
                out.append(f"logging.disable: {old} -> {new}")
            continue
        for f, a, b in zip(fields, old, new or old):
            if a == b or _IMPORTED["loggers"].get((name, f), ABSENT) == b:  # unchanged, or as an import left it
                continue
            out.append(f"logger {name!r}: {f} {_short(a)} -> {_short(b)}")
    return out


def _loggers_restore(before: dict) -> None:
    logging.disable(before["<disable>"])
    for name, state in before.items():
        if name == "<disable>":
            continue
        level, handlers, propagate, disabled = state
        lg = logging.root if name == "<root>" else logging.getLogger(name)
        lg.setLevel(level)
        pytest_handlers = [h for h in lg.handlers if type(h).__module__.startswith("_pytest")]
        lg.handlers[:] = list(handlers) + pytest_handlers
        lg.propagate, lg.disabled = propagate, disabled


# ---- SGLang's runtime context (published server args, parallel topology, flags) ----

def _sglang_context() -> Any:
    rc = sys.modules.get("sglang.srt.runtime_context")
    if rc is None:
        return ABSENT
    ctx, par = rc._CONTEXT, rc._CONTEXT.parallel
    return {
        "server_args": ctx._server_args,
        "config_bags": ctx._config_bags,
        "publish_role": ctx._publish_role,
        "overrides_log": list(ctx._overrides_log),
        "flags": (ctx.flags, rc._group_leaves(ctx.flags)),
        "resources": (ctx.resources, rc._group_leaves(ctx.resources)),
        "forward": (ctx.forward, dict(ctx.forward._plain)),
        "parallel.stamp": dict(par._stamp),
        "parallel.overrides": dict(par._overrides),
        "parallel.config": par._config,
    }


def _sglang_context_diff(before: Any, after: Any) -> list[str]:
    if before is ABSENT or after is ABSENT:
        return []
    out = []
    for k in ("server_args", "config_bags", "parallel.config"):
        if before[k] is not after[k]:
            out.append(f"SGLang {k}: {'published' if before[k] is None else 'replaced'}"
                       if after[k] is not None else f"SGLang {k}: cleared")
    if before["publish_role"] != after["publish_role"]:
        out.append(f"SGLang publish role: {before['publish_role']!r} -> {after['publish_role']!r}")
    if before["overrides_log"] != after["overrides_log"]:
        out.append(f"SGLang overrides log: {len(before['overrides_log'])} -> {len(after['overrides_log'])} entries")
    for k in ("flags", "resources", "forward"):
        (obj_a, val_a), (obj_b, val_b) = before[k], after[k]
        if obj_a is not obj_b:
            out.append(f"SGLang {k}: replaced")
        else:
            out += _dict_diff(val_a, val_b, f"SGLang {k}")
    out += _dict_diff(before["parallel.stamp"], after["parallel.stamp"], "SGLang parallel (override_permanently)")
    out += _dict_diff(before["parallel.overrides"], after["parallel.overrides"], "SGLang parallel (override)")
    return out


def _sglang_context_restore(before: Any) -> None:
    rc = sys.modules.get("sglang.srt.runtime_context")
    if rc is None or before is ABSENT:
        return
    ctx, par = rc._CONTEXT, rc._CONTEXT.parallel
    ctx._server_args, ctx._config_bags = before["server_args"], before["config_bags"]
    ctx._publish_role, ctx._overrides_log = before["publish_role"], list(before["overrides_log"])
    for k in ("flags", "resources"):
        obj, leaves = before[k]
        setattr(ctx, k, obj)
        rc._restore_leaves(obj, leaves)
    fwd, plain = before["forward"]
    ctx.forward = fwd
    fwd._plain.clear()
    fwd._plain.update(plain)
    par._stamp, par._overrides, par._config = dict(before["parallel.stamp"]), dict(before["parallel.overrides"]), \
        before["parallel.config"]


# ---- torch's process-wide settings ----

def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_default_dtype"):
        return ABSENT
    return {"default dtype": torch.get_default_dtype(), "grad enabled": torch.is_grad_enabled(),
            "num threads": torch.get_num_threads(),
            "deterministic algorithms": torch.are_deterministic_algorithms_enabled()}


def _torch_diff(before: Any, after: Any) -> list[str]:
    if before is ABSENT or after is ABSENT:
        return []
    return _dict_diff(before, after, "torch")


def _torch_restore(before: Any) -> None:
    torch = sys.modules.get("torch")
    if torch is None or before is ABSENT:
        return
    torch.set_default_dtype(before["default dtype"])
    torch.set_grad_enabled(before["grad enabled"])
    torch.set_num_threads(before["num threads"])
    torch.use_deterministic_algorithms(before["deterministic algorithms"])


# ---- the plugin's own process-wide registries ----

def _attr(module: str, name: str) -> Any:
    m = sys.modules.get(module)
    return getattr(m, name, ABSENT) if m is not None else ABSENT


def _plugin() -> dict:
    metrics = sys.modules.get("sglang_glm_ext.l3.hicache.metrics")
    standins = sys.modules.get("sglang_glm_ext.l3.demo.cpu_standins")
    return {
        "plugin ledger": _attr("sglang_glm_ext.plugin.register", "_LEDGER"),
        "plugin disabled": _attr("sglang_glm_ext.plugin.register", "_DISABLED"),
        "L3 launched in this process": _attr("sglang_glm_ext.l3.hooks", "_LAUNCHED"),
        # read once per process; read as on, it stays on for every later test (off / unread: the env decides)
        "cg_mem switch read as on": _attr("sglang_glm_ext.cuda_graph_mem.hooks", "_ACTIVE") is True,
        "L3 metrics sources (owners attached)": (sum(metrics.registered_sources().values())
                                                  if metrics is not None else ABSENT),
        "CPU stand-ins for SGLang's copy ops installed": standins.installed() if standins is not None else ABSENT,
    }


def _plugin_diff(before: dict, after: dict) -> list[str]:
    out = []
    for k, a in before.items():
        b = after[k]
        if a is ABSENT or b is ABSENT or _same(a, b):
            continue
        if k == "plugin ledger" and a is None:  # registration: idempotent and one-way in a real process
            continue
        out.append(f"{k}: {_short(a)} -> {_short(b)}")
    return out


def _plugin_restore(before: dict) -> None:
    hooks = sys.modules.get("sglang_glm_ext.l3.hooks")
    if hooks is not None and before["L3 launched in this process"] is not ABSENT:
        hooks._LAUNCHED = before["L3 launched in this process"]
    cg = sys.modules.get("sglang_glm_ext.cuda_graph_mem.hooks")
    if cg is not None and cg._ACTIVE is True and not before["cg_mem switch read as on"]:
        cg._ACTIVE = None
    standins = sys.modules.get("sglang_glm_ext.l3.demo.cpu_standins")
    was = before["CPU stand-ins for SGLang's copy ops installed"]
    if standins is not None and was is not ABSENT and standins.installed() != was:
        (standins.install if was else standins.uninstall)()


# ---- what imports change: recorded, so a first import is not a leak of the test that made it ----

# "replaced": a module object an import put in place of another under the same name (transformers' lazy aliases,
# e.g. transformers.tokenization_utils_fast, become the real module when first imported).
_IMPORTED: dict = {"env": {}, "sys.path": set(), "modules": set(), "replaced": {}, "loggers": {}}
_import_depth = threading.local()


def _record_import(before: dict) -> None:
    env = _environ()
    for k, v in env.items():
        if before["env"].get(k, ABSENT) != v:
            _IMPORTED["env"][k] = v
    _IMPORTED["sys.path"].update(p for p in sys.path if p not in before["sys.path"])
    modules = before["modules"]
    for n, m in list(sys.modules.items()):
        old = modules.get(n, ABSENT)
        if old is ABSENT:
            if isinstance(m, types.ModuleType) and getattr(m, "__spec__", None) is None:
                _IMPORTED["modules"].add(n)
        elif old is not m:
            _IMPORTED["replaced"][n] = m
    loggers = _loggers()
    for name, state in loggers.items():
        old = before["loggers"].get(name)
        if name == "<disable>" or old is None:
            continue
        for f, a, b in zip(("level", "handlers", "propagate", "disabled"), old, state):
            if a != b:
                _IMPORTED["loggers"][(name, f)] = b


def trace_imports() -> None:
    """Wrap importlib's ``_find_and_load`` (what every ``import`` of a module not yet loaded calls) so the outermost
    import of each thread records what it changed. Idempotent."""
    import importlib._bootstrap as bootstrap

    real = bootstrap._find_and_load
    if getattr(real, "_leakguard", False):
        return

    def _find_and_load(name, import_):
        if getattr(_import_depth, "n", 0):
            return real(name, import_)
        before = {"env": _environ(), "sys.path": set(sys.path), "modules": dict(sys.modules), "loggers": _loggers()}
        _import_depth.n = 1
        try:
            return real(name, import_)
        finally:
            _import_depth.n = 0
            _record_import(before)

    _find_and_load._leakguard = True
    bootstrap._find_and_load = _find_and_load


PROBES: tuple[Probe, ...] = (
    Probe("environment", _environ, lambda a, b: _dict_diff(a, b, "env", _IMPORTED["env"]), _env_restore),
    Probe("sys.path", lambda: list(sys.path), _path_diff, _path_restore),
    Probe("cwd", os.getcwd, _eq_diff("cwd"), os.chdir),
    Probe("umask", _umask, _eq_diff("umask"), os.umask),
    Probe("signal handlers", _signals, lambda a, b: _dict_diff(a, b, "signal handler"), _signals_restore),
    Probe("switch interval", sys.getswitchinterval, _eq_diff("sys.getswitchinterval()"), sys.setswitchinterval),
    Probe("sys.modules", _modules, _modules_diff, _modules_restore),
    Probe("logging", _loggers, _loggers_diff, _loggers_restore),
    Probe("SGLang runtime context", _sglang_context, _sglang_context_diff, _sglang_context_restore),
    Probe("torch", _torch, _torch_diff, _torch_restore),
    Probe("plugin", _plugin, _plugin_diff, _plugin_restore),
)


def snapshot() -> dict:
    return {p.name: p.read() for p in PROBES}


def diff(before: dict, after: dict) -> list[str]:
    out = []
    for p in PROBES:
        out += p.diff(before[p.name], after[p.name])
    return out


def restore(before: dict) -> None:
    """Put back what ``diff`` found changed, probe by probe; a probe that cannot restore is skipped."""
    after = snapshot()
    for p in PROBES:
        if p.restore is not None and p.diff(before[p.name], after[p.name]):
            try:
                p.restore(before[p.name])
            except Exception:  # noqa: BLE001 - best effort: the test has failed already, naming the leak
                pass


@contextmanager
def kept(*names: str):
    """The named probes' state (default: SGLang's runtime context) put back when the block ends: for a fixture that
    publishes server args or stamps a topology for its scope."""
    names = names or ("SGLang runtime context",)
    probes = [p for p in PROBES if p.name in names]
    assert len(probes) == len(names), f"unknown probe(s): {sorted(set(names) - {p.name for p in probes})}"
    before = {p.name: p.read() for p in probes}
    try:
        yield
    finally:
        for p in probes:
            if p.diff(before[p.name], p.read()):
                p.restore(before[p.name])


def message(what: str, changes: list[str]) -> str:
    lines = "\n  ".join(changes[:40]) + (f"\n  ... and {len(changes) - 40} more" if len(changes) > 40 else "")
    return (f"{what} left process-wide state changed; every test after it in this process would see it (put back "
            f"now, so only this test fails):\n  {lines}")
