"""A progress line on stderr while the benchmarks run."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``[####....] 3/25 case_name  12s``: redrawn in place on a terminal, one line
    per step otherwise (logs, pipes)."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 24) -> None:
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.count = 0
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, label: str) -> None:
        """Announce the step about to run."""
        self.count += 1
        filled = self.width * (self.count - 1) // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        text = f"[{bar}] {self.count}/{self.total} {label}  {elapsed:.0f}s"
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        """Finish the line."""
        elapsed = time.perf_counter() - self.start
        text = f"[{'#' * self.width}] {self.total}/{self.total} done  {elapsed:.0f}s"
        self.stream.write(("\r\033[K" + text + "\n") if self.tty else text + "\n")
        self.stream.flush()
