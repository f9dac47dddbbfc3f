"""A flow run cancelled in Prefect (the UI's "Cancel", `prefect flow-run cancel`) stops like Ctrl-C.

A worker that started the run ends its process on a cancel, but a flow run started by `attune tune`
has no worker: Prefect marks it CANCELLING and nothing else happens. A thread asks the API for the
run's state every second and turns a cancel into a stop request (attune.interrupt), which the
campaign honours within seconds, its running trial included.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

from attune import interrupt

POLL_S = 1.0


def _watch(flow_run_id: str, done: threading.Event) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        while not done.wait(POLL_S):
            try:
                state = client.read_flow_run(flow_run_id).state
            except Exception:  # noqa: BLE001 - an API hiccup is no cancel; ask again next second
                continue
            if state is not None and (state.is_cancelling() or state.is_cancelled()):
                interrupt.request_stop("cancel")
                return


@contextlib.contextmanager
def stop_on_cancel() -> Iterator[None]:
    """While the block runs, a cancel of the current flow run requests a stop."""
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if run_id is None:
        yield
        return
    done = threading.Event()
    context = contextvars.copy_context()   # Prefect's settings (the API's URL) live in context variables
    watcher = threading.Thread(target=context.run, args=(_watch, str(run_id), done), name="attune-cancel-watch",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=5)
