"""Real Prefect (and MLflow) servers for tests and scripts: started on loopback, stopped by pid.

    with prefect_server(tmp_path) as server:          # `prefect server start` on a free port
        env = server.client_env(ATTUNE_HOME=...)      # what a client or worker process needs
        with prefect_worker(server, "attune-sim", cwd=REPO, env=env):
            ...

Every process starts in its own session (process group), so teardown signals the whole group:
SIGTERM, a grace period, then SIGKILL. Settings are offline: analytics off, no telemetry, a
per-test PREFECT_HOME and SQLite file, and short polling intervals so tests wait less.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

BIN = Path(sys.executable).parent

# Offline everywhere: Prefect analytics, MLflow telemetry, and the generic opt-out some libraries read.
OFFLINE = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
           "DO_NOT_TRACK": "1", "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
           "PREFECT_TELEMETRY_ENABLE_RESOURCE_METRICS": "false"}


FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str                  # http://127.0.0.1:PORT (the UI); the API is url + "/api"
    home: Path
    proc: subprocess.Popen
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)        # how it was started, for restart()
    start_env: dict[str, str] = field(default_factory=dict)

    def restart(self, down_s: float = 2.0, timeout_s: float = 120.0) -> None:
        """Stop the server by its pid and start it again on the same port and database."""
        stop(self.proc)
        time.sleep(down_s)
        self.proc = spawn(self.argv, self.start_env, self.log, cwd=self.home)
        wait_http(f"{self.api_url}/health", self.proc, self.log, timeout_s, expect="true")

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def client_env(self, **extra: str) -> dict[str, str]:
        """Environment for a process that talks to this server (a worker, `prefect deploy`, a flow)."""
        return dict(self.env, PREFECT_API_URL=self.api_url, **{k: str(v) for k, v in extra.items()})

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)

    def api(self, path: str, body: Any = None, method: str | None = None) -> Any:
        """JSON over the server's REST API (no client settings to get wrong): GET, or POST with a body."""
        data = None if body is None else json.dumps(body, default=str).encode()
        request = urllib.request.Request(f"{self.api_url}/{path.lstrip('/')}", data=data,
                                         headers={"Content-Type": "application/json"},
                                         method=method or ("POST" if data is not None else "GET"))
        for attempt in range(6):
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    text = reply.read()
                return json.loads(text) if text else None
            except urllib.error.HTTPError as err:
                # A busy SQLite server answers 503 (database locked) now and then; Prefect's own
                # client retries those too. Anything else is the caller's error.
                if err.code not in (429, 502, 503) or attempt == 5:
                    raise
            except (ConnectionError, TimeoutError):
                if attempt == 5:
                    raise
            time.sleep(0.5 * 2 ** attempt)

    def wait_flow_run(self, flow_run_id: str, timeout_s: float, worker_log: Path | None = None) -> dict:
        """Poll a flow run until it is final; its JSON. On timeout, the server and worker logs say why."""
        deadline = time.monotonic() + timeout_s
        run: dict = {}
        while time.monotonic() < deadline:
            run = self.api(f"flow_runs/{flow_run_id}")
            if run["state"] and run["state"]["type"] in FINAL:
                return run
            time.sleep(0.5)
        raise TimeoutError(f"flow run {flow_run_id} still {run.get('state', {}).get('name')} after {timeout_s:.0f}s\n"
                           f"worker:\n{tail(worker_log) if worker_log else ''}\nserver:\n{self.log_tail(15)}")


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= OFFLINE | {"PREFECT_HOME": str(home), "PREFECT_PROFILES_PATH": str(home / "profiles.toml"),
                      "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    return env


def spawn(argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a process and everything it started, by pid: its process group, and any descendant
    that left the group (a worker may start flow runs in sessions of their own)."""
    family = descendants(proc.pid)
    if proc.poll() is None:
        _kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    _kill_group(proc.pid, signal.SIGKILL)  # children may outlive the leader
    for pid in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def descendants(pid: int) -> list[int]:
    """Pids of the process's children, grandchildren, ... (from /proc; empty where there is none)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # start_new_session=True made the pid its group id


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float, expect: str | None = None) -> None:
    """Poll `url` until it answers 200 (and contains `expect`), the process dies, or time runs out."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode} before {url} answered:\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                body = reply.read().decode(errors="replace")
                if reply.status == 200 and (expect is None or expect in body):
                    return
                last = f"HTTP {reply.status}: {body[:200]}"
        except OSError as err:
            last = str(err)
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s (last: {last}):\n{tail(log)}")


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises SystemExit while inside, so `finally` blocks stop the servers (Python's default
    SIGTERM ends the process at once and would leave them running)."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        yield
        return

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def prefect_server(workdir: Path, ui: bool = False, timeout_s: float = 120.0,
                   port: int | None = None) -> Iterator[Server]:
    """`prefect server start` on 127.0.0.1 with its own PREFECT_HOME and SQLite database."""
    home = Path(workdir) / "prefect-home"
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = base_env(home) | {
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_UI_ENABLED": str(ui).lower(),
        # A task waiting for a tag concurrency slot retries after at most this long (default 30 s).
        "PREFECT_SERVER_TASKS_TAG_CONCURRENCY_SLOT_WAIT_SECONDS": "1",
        "PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS": "1",
    }
    log = home / "server.log"
    argv = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
            "--analytics-off"] + ([] if ui else ["--no-ui"])
    proc = spawn(argv, env, log, cwd=home)
    server = Server(url=f"http://127.0.0.1:{port}", home=home, proc=proc, log=log,
                    env={k: v for k, v in env.items() if not k.startswith("PREFECT_SERVER_")
                         and k != "PREFECT_API_DATABASE_CONNECTION_URL"}, argv=argv, start_env=env)
    try:
        with stop_on_sigterm():
            wait_http(f"{server.api_url}/health", proc, log, timeout_s, expect="true")
            yield server
    finally:
        stop(server.proc)   # after a restart() the server runs under a new pid


@contextlib.contextmanager
def prefect_worker(server: Server, pool: str, cwd: Path, env: dict[str, str] | None = None,
                   limit: int | None = None, timeout_s: float = 90.0) -> Iterator[subprocess.Popen]:
    """`prefect worker start --pool POOL --type process`, polling every second; stopped on exit."""
    env = dict(env or server.client_env())
    env |= {"PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "PREFECT_WORKER_HEARTBEAT_SECONDS": "5"}
    log = server.home / f"worker-{pool}.log"
    argv = [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process",
            "--name", f"test-{pool}"] + (["--limit", str(limit)] if limit else [])
    proc = spawn(argv, env, log, cwd=cwd)
    proc.log_path = log  # type: ignore[attr-defined]  # for messages when a run does not finish
    try:
        _wait_worker(server, pool, proc, log, timeout_s)
        yield proc
    finally:
        stop(proc)


def _wait_worker(server: Server, pool: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Until the worker has sent its first heartbeat (it then polls for runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(OSError, ValueError):
            if server.api(f"work_pools/{pool}/workers/filter", {}):
                return
        time.sleep(0.5)
    raise TimeoutError(f"worker for {pool} did not register within {timeout_s:.0f}s:\n{tail(log)}")


@contextlib.contextmanager
def mlflow_server(workdir: Path, timeout_s: float = 120.0, port: int | None = None) -> Iterator[Server]:
    """`mlflow server` on 127.0.0.1 over a SQLite file, artifacts served from a folder beside it."""
    home = Path(workdir) / "mlflow-home"
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = base_env(home)
    log = home / "server.log"
    proc = spawn([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                  "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
                  "--artifacts-destination", str(home / "artifacts"), "--workers", "1"], env, log, cwd=home)
    server = Server(url=f"http://127.0.0.1:{port}", home=home, proc=proc, log=log, env=OFFLINE.copy())
    try:
        with stop_on_sigterm():
            wait_http(f"{server.url}/health", proc, log, timeout_s)
            yield server
    finally:
        stop(server.proc)   # after a restart() the server runs under a new pid
