"""The vocabulary a feature declares itself with: Feature, Flag, EnvVar, Patch, Tier (standard library only).

Feature folders import this module and nothing of `plugin/`; `plugin/registry.py` collects what they declare.
A Feature holds its Flag and EnvVar records; each Patch points at its Feature. Whether a feature is switched on
is derived from its own switch flags (and the env var riding on each), read from the plugin values carried on
SGLang's ServerArgs record, so a hook asks its own FEATURE without the plugin machinery. A feature that SGLang's
own arguments switch on (megamoe: `--moe-a2a-backend megamoe`) says so with `active_when`, a predicate on that
record.
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# ServerArgs is a sealed msgspec struct (no field can be added), but it accepts non-field underscore attributes
# and pickles them with the record: the plugin's flag values ride there to every scheduler subprocess.
CARRIER_ATTR = "_glm_ext"


class PluginFlagError(ValueError):
    """A plugin flag has a bad value; raised before serving starts."""


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str

    def raw(self) -> str | None:
        return os.environ.get(self.name)

    def get_bool(self) -> bool:
        value = os.environ.get(self.name, self.default).strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("", "0", "false", "no", "off"):
            return False
        raise ValueError(f"{self.name}={os.environ.get(self.name)!r}: expected 1/0/true/false")

    def is_set(self) -> bool:
        return self.name in os.environ


@dataclass(frozen=True)
class Flag:
    name: str  # attribute / Engine keyword; the CLI spelling is derived (`cli`)
    help: str
    kind: str = "bool"  # bool | path | int | choice
    default: Any = None
    env: EnvVar | None = None  # a bool flag's env var: set to 1, it turns the flag on without the flag
    switch: bool = False  # True: this flag switches its feature on
    choices: tuple[str, ...] = ()  # a choice flag's values (its default None: left to the feature to resolve)
    switch_on: tuple[str, ...] = ()  # a choice flag's values that switch its feature on (`switch` for a choice)

    @property
    def metavar(self) -> str:
        """How --help and the flag table name its value: `PATH`, `INT`, `{auto,on,off}`."""
        return "{" + ",".join(self.choices) + "}" if self.choices else self.kind.upper()

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def switches(self) -> bool:
        """Whether some value of this flag switches its feature on."""
        return self.switch or bool(self.switch_on)

    def switches_on(self, values: Mapping[str, Any]) -> bool:
        """Whether this flag's value in `values` switches its feature on."""
        value = self.value_in(values)
        if self.switch_on:
            return value is not None and str(value).strip().lower() in self.switch_on
        return self.switch and bool(value)

    def value_in(self, values: Mapping[str, Any]) -> Any:
        """This flag's value in `values` (its default when absent), turned on by its env var if that is set."""
        value = values.get(self.name, self.default)
        if self.env is not None and self.kind == "bool" and not value and self.env.get_bool():
            return True
        return value


@dataclass(frozen=True)
class Feature:
    """One feature as users see it (doctor, the flag table, errors). "applied" (its patches are in SGLang's code)
    and "active" (switched on for this launch) are different questions; doctor reports both."""

    name: str
    title: str
    seed_lines: str  # lines of the seed spec this feature carries ("-" for plugin infrastructure)
    flags: tuple[Flag, ...] = ()
    env: tuple[EnvVar, ...] = ()
    # Infrastructure and safety checks run whenever the plugin does; a user cannot switch them off.
    always_on: bool = False
    # Set when this build cannot serve the feature at all, whatever the patches say.
    unavailable: str = ""
    # Checks this feature's flag values (all plugin flags, defaults filled in); raises PluginFlagError.
    validate: Callable[[Mapping[str, Any]], None] | None = field(default=None, compare=False)
    # Switched on by SGLang's own arguments: a predicate on a ServerArgs record (it reads plain attributes, so
    # doctor can hand it a namespace of the `sglang_args` it was given). None: only flags switch it on.
    active_when: Callable[[Any], bool] | None = field(default=None, compare=False)
    # The ServerArgs attributes `active_when` reads; doctor accepts each as an option (`--moe-a2a-backend`).
    sglang_args: tuple[str, ...] = ()
    # True: the feature does nothing without a CUDA GPU (doctor shows it unavailable on a node with none).
    needs_cuda_gpu: bool = False

    def switched_on(self, values: Mapping[str, Any], server_args: Any = None) -> bool:
        """Whether these plugin flag values (env vars folded in here), or SGLang's own arguments `server_args`
        when given (None: they are not asked), switch this feature on."""
        if self.always_on or any(f.switches_on(values) for f in self.flags):
            return True
        return self.active_when is not None and server_args is not None and bool(self.active_when(server_args))

    def is_active(self, server_args: Any = None) -> bool:
        """Whether the user switched this feature on for this launch: read from `server_args` (the values carried
        on it, and SGLang's own arguments for `active_when`), or from the record SGLang published in this
        process when none is given."""
        record = server_args if server_args is not None else published_server_args()
        return self.switched_on(carried_values(record), record)


def published_server_args() -> Any:
    """The ServerArgs record SGLang published in this process, or None (tools, tests, a process outside SGLang)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:  # nothing published, or no SGLang: the caller falls back to defaults
        return None


def carried_values(server_args: Any = None) -> Mapping[str, Any]:
    """The plugin flag values attached to a ServerArgs record; {} when there are none (defaults apply)."""
    if server_args is None:
        server_args = published_server_args()
    return getattr(server_args, CARRIER_ATTR, None) or {}


# The plugin's stand-in `sgl_kernel` packages (cpu_serve's for a CPU, gpu_bringup's for a GPU without a matching
# sgl-kernel): each folder holds only that package and goes on sys.path only in its own mode. Neither is ever "a real
# sgl_kernel" to the other's checks.
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
STANDIN_DIRS = tuple(os.path.join(_PKG_DIR, folder, "_shadow") for folder in ("cpu_serve", "gpu_bringup"))


def real_sgl_kernel() -> str:
    """'' when no ``sgl_kernel`` other than one of the plugin's stand-ins can be imported here, else where the real one
    is (an imported module's file, or where ``import sgl_kernel`` would find it)."""
    import importlib.machinery
    import sys

    loaded = sys.modules.get("sgl_kernel")
    if loaded is not None and not getattr(loaded, "GLM_EXT_STANDIN", False):
        return getattr(loaded, "__file__", None) or "an already imported sgl_kernel"
    others = [p for p in sys.path if os.path.abspath(p or os.getcwd()) not in STANDIN_DIRS]
    spec = importlib.machinery.PathFinder.find_spec("sgl_kernel", others)
    if spec is None:
        return ""
    return spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]


def switch_on(switch: "EnvVar") -> bool:
    """A tier's switch is set to a true value (a bad value counts as off; the feature's validate says so)."""
    try:
        return switch.get_bool()
    except ValueError:
        return False


def standin_reachable(shadow_dir: str) -> bool:
    """Whether ``import sgl_kernel`` in this process (or a child spawned from it) reaches the stand-in in
    ``shadow_dir`` (one of STANDIN_DIRS)."""
    import sys

    return any(os.path.abspath(p or os.getcwd()) == shadow_dir for p in sys.path)


def refuse_tier(switch: "EnvVar", refusal_reason: Callable[[], str]) -> None:
    """A tier's launch check (CPU serving mode, GPU bring-up): a bad switch value, or the switch on where
    ``refusal_reason()`` is not empty, raises PluginFlagError with one line; off, nothing is checked."""
    try:
        on = switch.get_bool()
    except ValueError as exc:
        raise PluginFlagError(str(exc)) from None
    if on:
        why = refusal_reason()
        if why:
            raise PluginFlagError(f"{switch.name}=1 refused: {why}")


def activate_standin(shadow_dir: str, switch: "EnvVar", refusal_reason: Callable[[], str]) -> str:
    """Put a tier's stand-in directory at the front of ``sys.path`` when its switch is on and ``refusal_reason()``
    is empty. Returns '' when the stand-in is reachable now, else why not (the switch is off, or the refusal).
    The CPU serving mode and the GPU bring-up tier share this: SGLang's spawned schedulers import ``sgl_kernel``
    before their first line runs, and spawn copies the parent's ``sys.path``."""
    import sys

    if not switch_on(switch):
        return f"{switch.name} is not set"
    why = refusal_reason()
    if why:
        return why
    if not standin_reachable(shadow_dir):
        sys.path.insert(0, shadow_dir)
    return ""


class Tier(str, enum.Enum):
    # Guard patches make plugin flags parse and fail with a clear message; they go in on any SGLang version.
    GUARD = "guard"
    # Feature patches change serving behaviour; only on an SGLang in their own sglang_versions (or when forced).
    FEATURE = "feature"
    # Demo/test-only stand-ins (CPU copies of GPU ops): declared so the manifest and contract test cover them, but
    # register() never applies them; only the feature's own guarded installer does, never in a server or by a GPU.
    DEMO = "demo"
    # CPU serving stand-ins (cpu_serve/): applied by register() only in a process where SGLANG_GLM_EXT_CPU_SERVE=1 and
    # the mode's own checks passed (no accelerator, no real sgl_kernel); skipped with that reason everywhere else.
    CPU_SERVE = "cpu_serve"
    # GPU bring-up stand-ins (gpu_bringup/): applied by register() only where SGLANG_GLM_EXT_GPU_BRINGUP=1 and the
    # tier's own checks passed (a CUDA GPU, no real sgl_kernel, SGLang's settings for it); skipped elsewhere.
    GPU_BRINGUP = "gpu_bringup"


@dataclass(frozen=True)
class Patch:
    """One change to SGLang. Every field ends up in docs_internal/patch_manifest.md."""

    id: str
    target: str  # dotted path of the patched attribute in SGLang
    hook_type: str  # before | after | around | replace (SGLang HookType values); bind: module globals (DEMO, CPU_SERVE)
    hook: str  # "module:function" of our hook
    feature: Feature
    tier: Tier
    reason: str
    seed_lines: str  # lines of ../shared/seed/000_*.txt this carries ("-" for plugin infrastructure)
    sglang_versions: tuple[str, ...]  # releases the patch applies to (the ledger enforces it for FEATURE tier)
    remove_when: str
    # Parameter names the hook relies on, checked by the contract test against the installed SGLang.
    signature: tuple[str, ...]
    # sha256[:16] of the target's source at the time the hook was written (drift check, vllm-sail style).
    source_sha: str = ""
    # Ids of AFTER patches on the same target whose hooks must run before this one's on every call: the ledger
    # applies them first (so they sit inside this one's wrapper) and fails this patch where they do not.
    after: tuple[str, ...] = ()

    def resolve_hook(self) -> Callable:
        module, _, name = self.hook.partition(":")
        return getattr(importlib.import_module(module), name)


def patch_for(feature: Feature, *, tier: Tier, sglang_versions: tuple[str, ...], **shared: Any) -> Callable[..., Patch]:
    """`Patch` with what every declaration of one patches.py shares given once: its feature, tier and SGLang
    versions, and any other field all of that file's declarations repeat. A declaration then states only what is
    particular to it, and may still give a shared field itself (a launch check among CPU stand-ins)."""
    return functools.partial(Patch, feature=feature, tier=tier, sglang_versions=sglang_versions, **shared)


class Problem(str):
    """One doctor problem: its text (a str, so doctor's `problems` stays a list of strings) and `fix`, one line
    saying what to do about it. A folder's doctor part returns these; a plain str gets its part's `fix`."""

    fix: str

    def __new__(cls, text: str, fix: str = "") -> "Problem":
        self = super().__new__(cls, text)
        self.fix = fix
        return self

    def __reduce__(self):
        return (Problem, (str(self), self.fix))


@dataclass(frozen=True)
class DoctorInput:
    """What doctor hands every folder's `doctor.report()`: the plugin-wide facts, gathered once."""

    values: Mapping[str, Any]  # the plugin flag values of the launch being checked (env vars folded in)
    gpus: tuple[Mapping[str, Any], ...]  # visible CUDA GPUs: {index, name, sm}
    versions: Mapping[str, str | None]  # python, sglang, torch, deep_gemm, flashinfer
    # SGLang-side values of the launch being checked, given to doctor on its command line (not plugin flags):
    # "hicache_size" (GB per rank, --hicache-size), "ranks_per_node" (--ranks-per-node), and each Feature's
    # sglang_args ("moe_a2a_backend" from --moe-a2a-backend, ...). Absent when not given. Given a launch's whole
    # command line (`doctor -- python -m sglang.launch_server ...`), every SGLang argument as SGLang's parser read
    # it (defaults included), "ranks_per_node" from tp*pp*dp / nnodes, and "ranks_source" saying so.
    launch: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DoctorPart:
    """One folder's part of the doctor report: keys merged into "hardware", and problems (non-empty: exit 1).
    ``sections``: top-level keys of the report this folder owns (e.g. "l3"); additions to doctor's schema 1,
    never one of its fixed keys. Each problem is a `Problem` with its own fix, or a plain str whose fix is
    ``fix`` (the part's fix for what it finds). ``unavailable``: {feature name: why} for features this node
    cannot serve (no kernel for its GPUs, ...); doctor shows them unavailable, and the part itself reports the
    problem when the launch being checked switches one on (it knows that fix)."""

    hardware: Mapping[str, Any]
    problems: tuple[str, ...] = ()
    sections: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""
    unavailable: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DoctorReporter:
    """One folder's entry in doctor (plugin/registry.py DOCTOR_PARTS): which keys of the report it owns and how
    it fills and shows them, so plugin/doctor.py names no feature's keys. ``report`` builds the folder's
    `DoctorPart`, whose "hardware" keys must be exactly ``hardware`` and whose top-level sections exactly
    ``sections`` (doctor refuses a part that strays: keys are what JSON readers rely on). ``render(hardware,
    sections)`` gives the text report's lines from those keys of a finished report (each a mapping of its own
    keys only)."""

    report: Callable[[DoctorInput], DoctorPart]
    render: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]
    hardware: tuple[str, ...]
    sections: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """`sglang_glm_ext.megamoe.doctor` -> `megamoe`: the folder named as its problems' source."""
        parts = self.report.__module__.split(".")
        return parts[1] if len(parts) > 2 else "plugin"
