"""A Prefect API for one command when no server is configured, started so that Ctrl-C reaches the
campaign only.

Prefect's own ephemeral server is a child in the command's process group: Ctrl-C in a terminal
signals the whole group, the API dies first, and the campaign, which would stop cleanly, then spends
minutes retrying calls to it (seen: 67 "EventsWorker failed" errors and a traceback after 5 min).
This starts the same API (`prefect server start`, on Prefect's database under PREFECT_HOME) in a
session of its own, points the command at it, and stops it by its process group on the way out.
A command killed outright (SIGKILL, the OOM killer) has no way out: on Linux the server is told to
end with it (the parent-death signal), so no orphaned server keeps running.
With PREFECT_API_URL set, the configured server is used and nothing is started.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

from attune.errors import InputError
from attune.interrupt import end_process_group

PR_SET_PDEATHSIG = 1   # linux/prctl.h


def _end_with_parent() -> None:
    """In the server's process before exec: SIGTERM when the command that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


START_TIMEOUT_S = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def private_prefect_api() -> Iterator[str | None]:
    """The API URL the command's flows use: PREFECT_API_URL as set, else a server started here."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    server_env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false")
    # before Prefect is imported: its root settings, which threads without our context see, read it then
    os.environ["PREFECT_API_URL"] = api_url
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                     "--port", str(port), "--no-ui"], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=server_env, start_new_session=True,
                                    preexec_fn=_end_with_parent if sys.platform == "linux" else None)
            try:
                deadline = time.monotonic() + START_TIMEOUT_S
                while not _healthy(api_url):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        last = (log.read().strip().splitlines() or ["no output"])[-1][:200]
                        raise InputError("PREFECT_HOME", f"the local Prefect API did not start ({last}); set "
                                                         f"PREFECT_API_URL to use a running server")
                    time.sleep(0.1)
                with temporary_settings(updates={PREFECT_API_URL: api_url}):
                    yield api_url
            finally:
                end_process_group(proc, grace_s=10.0, kill_wait_s=5.0)
    finally:
        os.environ.pop("PREFECT_API_URL", None)
