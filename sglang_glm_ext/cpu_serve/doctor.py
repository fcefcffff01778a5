"""cpu_serve's part of `doctor`: `hardware.cpu_serve`, whether the CPU serving mode is on and may run here.

Keys: `mode` ("on" / "off": SGLANG_GLM_EXT_CPU_SERVE), `may_run` (bool), `why_not` ('' or the one line a launch
would refuse with), `standin_reachable` (whether `import sgl_kernel` reaches the stand-in in this process),
`accelerator` ('' or its name; asked only with the mode on), `real_sgl_kernel` ('' or its path), `use_cpu_engine` (SGLANG_USE_CPU_ENGINE).
A problem (exit 1) only when the mode is on and cannot run (with `doctor --device X`, also when X is not cpu).
"""

from __future__ import annotations

import os

from ..declare import DoctorInput, DoctorPart, DoctorReporter
from . import gate
from .feature import CPU_SERVE, USE_CPU_ENGINE


def report(inp: DoctorInput) -> DoctorPart:
    on = gate.mode_on()
    why = gate.refusal_reason() if on else ""
    device = inp.launch.get("device")  # doctor --device X: the launch's --device
    if on and not why and device is not None:
        why = gate.device_refusal(device)
    info = {
        "mode": "on" if on else "off",
        "may_run": on and not why,
        "why_not": why if on else f"{CPU_SERVE.name} is not set",
        "standin_reachable": gate.standin_reachable(),
        "accelerator": gate.visible_accelerator() if on else "",
        "real_sgl_kernel": gate.real_sgl_kernel() if on else "",
        "use_cpu_engine": os.environ.get(USE_CPU_ENGINE, ""),
    }
    problems = (f"{CPU_SERVE.name}=1 refused: {why}",) if why else ()
    return DoctorPart({"cpu_serve": info}, problems)


def render(hardware, sections) -> list[str]:
    """doctor's text line for `cpu_serve`."""
    cs = hardware.get("cpu_serve") or {}
    if not cs:
        return []
    return [f"  CPU serving mode ({CPU_SERVE.name}): {cs['mode']}"
            + (f"; may run here, sgl_kernel stand-in reachable: {cs['standin_reachable']}" if cs["may_run"]
               else ("; " + cs["why_not"] if cs["mode"] == "on" else ""))]


REPORTER = DoctorReporter(report, render, hardware=("cpu_serve",))
