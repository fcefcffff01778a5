"""The directory the CPU serving mode puts at the front of ``sys.path`` (``cpu_serve/gate.py``): it holds only the
``sgl_kernel`` stand-in package. Never a top-level package of the wheel; never on the path unless the mode is on and
its checks passed (no accelerator visible, no real ``sgl_kernel`` installed)."""
