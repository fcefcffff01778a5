"""Progress of a long tool run on stderr (``l3 fsck`` checksumming a large disk). A quick run prints nothing: the
first line comes only after ``delay`` seconds. On a terminal one line is redrawn in place and wiped at the end; in a
log (stderr not a terminal) a plain line every ``every_log`` seconds. Never on stdout, so ``--json`` output stays
clean (and ``--json`` runs get :meth:`Progress.off`)."""

from __future__ import annotations

import time
from typing import Callable, TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, label: str, out: "TextIO | None" = None, *, delay: float = 3.0, every_tty: float = 0.5,
                 every_log: float = 10.0, clock: Callable[[], float] = time.monotonic, tty: "bool | None" = None):
        self.label, self.out, self.clock = label, out, clock
        self.tty = bool(tty if tty is not None else out is not None and _isatty(out))
        self.every = every_tty if self.tty else every_log
        self.next_at = clock() + delay
        self.what, self.done, self.total = "", 0, 0
        self.drawn = 0  # width of the line on the terminal, to wipe it

    @classmethod
    def off(cls) -> "Progress":
        return cls("", None)

    def phase(self, what: str, total: int) -> None:
        self.what, self.done, self.total = what, 0, total

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.out is not None and self.clock() >= self.next_at:
            self._show()

    def _show(self) -> None:
        self.next_at = self.clock() + self.every
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        line = f"{self.label}: {self.what} {self.done:,}/{self.total:,}{pct}"
        if self.tty:
            self.out.write("\r" + line.ljust(self.drawn))
            self.drawn = max(self.drawn, len(line))
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def finish(self) -> None:
        """Wipe the terminal line (a log keeps its lines)."""
        if self.out is not None and self.drawn:
            self.out.write("\r" + " " * self.drawn + "\r")
            self.out.flush()
            self.drawn = 0


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False

