"""A request to stop: Ctrl-C, SIGTERM or a cancel in Prefect, seen by whatever work is running.

A campaign must stop within seconds of being told to, with its state saved: a GPU trial that runs on
after the user said stop is budget spent for nothing. A signal handler may do almost nothing safely,
so it only records the request here; the work checks it where it can stop cleanly (between trials,
and every 0.2 s inside a running trial's process loop, which then ends the trial's processes).

One request per process: the first reason given wins, and a second signal while a stop is already
under way ends the process at once (the state on disk is the last one saved, and a trial that was
running is charged at its estimate on resume).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

# exit codes a shell gives a process ended by the signal (128 + its number); a cancel counts as Ctrl-C
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "cancel": 130}

_lock = threading.Lock()
_reason: str | None = None


class StopRequested(Exception):
    """Raised where work stops because it was asked to (attune.interrupt.check)."""

    def __init__(self, reason: str):
        super().__init__(f"stopped by {reason}")
        self.reason = reason


def request_stop(reason: str) -> None:
    global _reason
    with _lock:
        if _reason is None:
            _reason = reason


def requested() -> str | None:
    """The reason a stop was requested, or None."""
    return _reason


def check() -> None:
    """Raise StopRequested if a stop was requested."""
    if _reason is not None:
        raise StopRequested(_reason)


def clear() -> None:
    """Forget a request (a process that runs another campaign afterwards, e.g. a test)."""
    global _reason
    with _lock:
        _reason = None


def _on_signal(signum: int, _frame) -> None:
    name = signal.Signals(signum).name
    if _reason is not None:   # asked twice: the user means now
        print(f"attune: {name} again, exiting now (the last saved state is kept)", file=sys.stderr, flush=True)
        os._exit(EXIT_CODES.get(name, 130))
    request_stop(name)
    print(f"attune: {name} received, stopping after saving the campaign's state (again to exit now)",
          file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM request a stop instead of raising wherever the main thread happens to be
    (a KeyboardInterrupt inside a library's retry loop is not a stop). Restores the previous handlers
    on exit; a no-op outside the main thread, where Python allows no handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def end_process_group(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = 10.0) -> None:
    """End a child started in a session of its own, with everything it started: SIGTERM to its
    process group, SIGKILL if it has not exited after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
