"""Progress reports of the tools (`vllm-specx bench`, `train`, `gen-data`, the demo): a tqdm bar
with a rate and an ETA for each long phase, a heartbeat line for a phase without a count (an
engine start), and plain lines for what is done.

On a terminal the bar redraws in place. In a log (the stream is not a TTY) it writes whole lines
instead, no carriage returns: one when it starts, one each time another tenth of the total is
done, one at least every `LOG_EVERY_S` seconds while work goes on, and the last at the end (the
overall rate). `quiet` (the tools' `--quiet`) turns bars and heartbeats off; lines stay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from typing import TextIO

from tqdm import tqdm

LOG_EVERY_S = 30.0  # a log line at least this often while a bar runs
LOG_STEPS = 10  # and one each time another 1/LOG_STEPS of the total is done
HEARTBEAT_S = 15.0  # a heartbeat line this often while a phase without a bar runs


class LogBar(tqdm):
    """tqdm for a log: each display a whole line (each 1/`LOG_STEPS` of the total, at least every
    `LOG_EVERY_S`, the start and the end), never a carriage return."""

    def __init__(self, *args, **kwargs):
        self._shown_step, self._shown_n, self._shown_t = None, None, 0.0
        kwargs.update(leave=False, dynamic_ncols=False, ncols=None)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if msg == "":  # close() clearing the bar: the final line is close's
            return False
        step = int(self.n * LOG_STEPS // self.total) if self.total else None
        now = self._time()
        further = self.n != self._shown_n and step != self._shown_step  # another tenth done
        if not further and now - self._shown_t < LOG_EVERY_S:
            return True
        self._shown_step, self._shown_n, self._shown_t = step, self.n, now
        self.fp.write(self.__str__() + "\n")
        self.fp.flush()
        return True

    def clear(self, nolock=False):  # tqdm.write() around a line: nothing to clear
        pass

    def close(self):
        if not self.disable and self.n != self._shown_n:
            self._ema_dt = lambda: None  # the last line: the overall rate
            self._shown_step = None
            self.display()
        super().close()


@dataclasses.dataclass(frozen=True)
class Reporter:
    """Where and how a tool reports: on `file` (default: stderr at the time of writing), bars and
    heartbeats off when `quiet`."""

    file: TextIO | None = None
    quiet: bool = False

    @property
    def stream(self) -> TextIO:
        return self.file or sys.stderr

    @property
    def tty(self) -> bool:
        return hasattr(self.stream, "isatty") and self.stream.isatty()

    def bar(self, total: int | None = None, desc: str = "", unit: str = "it", iterable=None,
            tick: float | None = None, **kwargs) -> tqdm:
        """A progress bar (tqdm's arguments): redrawn in place on a terminal, `LogBar` lines in
        a log, disabled when quiet. `tick`: also redrawn every `tick` seconds while nothing is
        done (its elapsed time moves on; in a log, a line each `LOG_EVERY_S`), for work that is
        done in large pieces (prompts that finish together)."""
        cls = tqdm if self.tty else LogBar
        kwargs.setdefault("dynamic_ncols", True)
        bar = cls(iterable, total=total, desc=desc, unit=unit, file=self.stream, disable=self.quiet, **kwargs)
        if tick and not bar.disable:
            def redraw():
                while True:
                    time.sleep(tick)
                    with bar.get_lock():  # close() sets `disable` before it takes the lock
                        if bar.disable:
                            return
                        bar.refresh(nolock=True)

            threading.Thread(target=redraw, name="vllm-specx-bar", daemon=True).start()
        return bar

    def quiet_libraries(self) -> None:
        """Where this reporter's bars are off or are log lines: transformers' and huggingface_hub's
        own bars off too (a model load's redraws are what a log cannot read). Process-wide."""
        if self.quiet or not self.tty:
            from transformers.utils import logging

            logging.disable_progress_bar()

    def line(self, text: str) -> None:
        """A line of its own (bars on the same stream redrawn under it)."""
        tqdm.write(text, file=self.stream)
        self.stream.flush()

    @contextlib.contextmanager
    def heartbeat(self, what: str, every: float = HEARTBEAT_S):
        """While the body runs, a line "<what> (N s)" every `every` seconds: a phase with no count
        to show (an engine start, a download); nothing when quiet."""
        if self.quiet:
            yield
            return
        stop, t0 = threading.Event(), time.monotonic()

        def beat():
            while not stop.wait(every):
                self.line(f"{what} ({time.monotonic() - t0:.0f} s)")

        thread = threading.Thread(target=beat, name="vllm-specx-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def vllm_bar(self, desc: str):
        """`use_tqdm` for vLLM's `LLM.generate`: its "Processed prompts" bar (prompts done, rate,
        ETA, vLLM's tokens/s estimate) as this reporter's bar named `desc`; False when quiet.
        vLLM's quick prompt-rendering pass gets no bar."""
        if self.quiet:
            return False

        def make(iterable=None, **kwargs):
            if iterable is not None:
                return iterable
            kwargs.pop("desc", None)
            kwargs.pop("dynamic_ncols", None)
            return self.bar(desc=desc, unit="prompt", tick=1.0, **kwargs)

        return make


def duration(seconds: float) -> str:
    """1 h 02 min, 3 min 05 s, 12.3 s."""
    seconds = float(seconds)
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
    if seconds >= 60:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{seconds:.1f} s"
