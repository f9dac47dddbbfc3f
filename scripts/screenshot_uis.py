"""Screenshots of both UIs for the README: a real Prefect server and MLflow server on loopback, a
small sim nightly re-tune (one recipe, so one campaign subflow) against them, then headless
Chromium on the Prefect flow-run pages and the MLflow experiment page. Both servers are stopped
by pid at the end, whatever happens.

    .venv/bin/python scripts/screenshot_uis.py            # writes docs/img/*.png
    .venv/bin/python scripts/screenshot_uis.py --keep     # leaves the work folder for a look
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from prefect_server import mlflow_server, prefect_server  # noqa: E402  (the tests' server helpers)

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1400,900", "--virtual-time-budget=10000"]

# One production recipe: the public llama3 8B recipe on 8 A100s, where the sim's campaign ships a
# gated recipe within this budget (compile on). gate_steps 20 keeps the script to a minute or two.
REGISTRY = """
[[recipe]]
name = "llama3-8b-a100"
path = "{recipe}"
cluster = "a100:8"
budget_gpu_hours = 12
replicates = 2
steps_per_trial = 5
gate_steps = 20
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "img"))
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("chromium not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="attune-uis-"))
    try:
        with prefect_server(work, ui=True) as prefect, mlflow_server(work) as mlflow:
            print(f"Prefect UI {prefect.url}   MLflow UI {mlflow.url}", flush=True)
            nightly_id = run_nightly(work, prefect, mlflow)
            campaign_id = subflow_of(prefect, nightly_id)
            experiment = mlflow_experiment(mlflow.url, "attune-campaigns")
            summary = prefect.api("artifacts/filter", {"artifacts": {"key": {"any_": ["nightly-retune"]}},
                                                       "sort": "CREATED_DESC", "limit": 1})[0]["id"]
            shots = {
                "prefect-nightly-run.png": f"{prefect.url}/runs/flow-run/{nightly_id}",
                "prefect-nightly-summary.png": f"{prefect.url}/artifacts/artifact/{summary}",
                "prefect-campaign-run.png": f"{prefect.url}/runs/flow-run/{campaign_id}",
            }
            for name, url in shots.items():
                screenshot(chromium, url, out / name, work)
                print(f"{out / name}  <-  {url}", flush=True)
            # MLflow's page needs a few clicks first (the columns worth comparing, the nested trials),
            # so that shot drives Chromium over the DevTools protocol instead of --screenshot.
            url = f"{mlflow.url}/#/experiments/{experiment}/runs"
            driven_screenshot(chromium, url, out / "mlflow-experiment.png", work,
                              ready='document.body && document.body.innerText.includes("campaign-")',
                              actions=MLFLOW_ACTIONS)
            print(f"{out / 'mlflow-experiment.png'}  <-  {url}", flush=True)
    finally:
        if args.keep:
            print(f"work folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def run_nightly(work: Path, prefect, mlflow) -> str:
    registry = work / "production.toml"
    registry.write_text(textwrap.dedent(REGISTRY.format(recipe=REPO / "recipes" / "public" / "llama3_8b.toml")))
    env = prefect.client_env(ATTUNE_HOME=work / "attune-home", ATTUNE_STORE=work / "store",
                             MLFLOW_TRACKING_URI=mlflow.url, PYTHONPATH=REPO, MPLBACKEND="Agg",
                             PREFECT_LOGGING_LEVEL="INFO")  # the run's decisions show in its Logs tab
    night = dt.date.today().isoformat()
    code = ("from flows.nightly import nightly_retune; "
            f"nightly_retune(registry={str(registry)!r}, night={night!r}, return_state=True)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"nightly run failed:\n{proc.stderr[-3000:]}")
    runs = prefect.api("flow_runs/filter", {"flows": {"name": {"any_": ["nightly-retune"]}},
                                            "sort": "START_TIME_DESC", "limit": 1})
    return runs[0]["id"]


def subflow_of(prefect, flow_run_id: str) -> str:
    runs = prefect.api("flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}})
    if not runs:
        raise RuntimeError("the nightly run started no campaign")
    return runs[0]["id"]


def mlflow_experiment(url: str, name: str) -> str:
    """The experiment's id, marked as model training (else MLflow 3 opens it as a GenAI app)."""
    query = urllib.parse.urlencode({"experiment_name": name})
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?{query}", timeout=30) as reply:
        experiment = json.loads(reply.read())["experiment"]["experiment_id"]
    body = json.dumps({"experiment_id": experiment, "key": "mlflow.experimentKind",
                       "value": "custom_model_development"}).encode()
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/set-experiment-tag", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=30).read()
    return experiment


# Close the assistant panel MLflow opens on a local server's first visit, show the columns that
# compare trials (throughput, MFU, GPU-hours, gain, role, lesson) instead of empty ones, and expand
# the campaign's parent run to its nested trial runs.
MLFLOW_ACTIONS = """(async () => {
  const sleep = (ms) => new Promise(r => setTimeout(r, ms));
  const q = (sel) => document.querySelector(sel);
  const done = [];
  const close = q('[data-component-id="mlflow.assistant.chat_panel.close"]');
  if (close) { close.click(); done.push("assistant closed"); await sleep(300); }
  const cols = Array.from(document.querySelectorAll('[data-testid="column-selection-dropdown"]'))
    .find(b => b.innerText.includes("Columns"));
  if (cols) { cols.click(); await sleep(1000); }
  let box = q('input[placeholder="Search columns"]');
  while (box && !(box.innerText || "").includes("Reset to defaults")) box = box.parentElement;
  if (box) {
    const leaf = (text) => Array.from(box.querySelectorAll("*"))
      .find(e => e.children.length === 0 && (e.innerText || "").trim() === text);
    for (const name of ["Dataset", "Source", "Models", "tokens_per_sec_per_gpu", "mfu", "gpu_hours", "gain",
                        "attune.role", "attune.lesson"]) {
      const el = leaf(name);
      if (el) { el.click(); done.push(name); await sleep(200); }
    }
  }
  document.dispatchEvent(new KeyboardEvent("keydown", {key: "Escape", bubbles: true}));
  await sleep(500);
  if (q('input[placeholder="Search columns"]') && cols) cols.click();
  await sleep(800);
  const expand = q('[data-component-id$="runnamecellrenderer.tsx_46"]');
  if (expand) { expand.click(); done.push("expanded"); }
  await sleep(1500);
  return done.join(", ");
})()"""


def screenshot(chromium: str, url: str, path: Path, work: Path) -> None:
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=work))  # a new empty profile per shot
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={path}", url],
                   check=True, capture_output=True, timeout=180)
    if not path.is_file() or path.stat().st_size < 10_000:
        raise RuntimeError(f"no real screenshot of {url} (got {path.stat().st_size if path.exists() else 0} bytes)")


def driven_screenshot(chromium: str, url: str, path: Path, work: Path, ready: str, actions: str,
                      timeout_s: float = 120.0) -> None:
    """Open `url` in headless Chromium, wait until `ready` (JS) is true, run `actions` (JS), then
    capture the 1400x900 viewport. Chromium runs in its own process group, killed at the end."""
    from websockets.sync.client import connect  # Prefect's dependency: no extra package

    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=work))
    flags = [f for f in CHROMIUM_FLAGS if not f.startswith("--virtual-time-budget")]
    proc = subprocess.Popen([chromium, *flags, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        # Chromium writes the port it picked into the profile folder.
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20) as ws:
            ids = iter(range(1, 10**6))

            def call(method: str, **params):
                ident = next(ids)
                ws.send(json.dumps({"id": ident, "method": method, "params": params}))
                while True:
                    message = json.loads(ws.recv(timeout=60))
                    if message.get("id") == ident:
                        return message.get("result", {})

            call("Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            while not call("Runtime.evaluate", expression=ready, returnByValue=True)["result"].get("value"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} never became ready ({ready})")
                time.sleep(0.5)
            time.sleep(1.0)
            call("Runtime.evaluate", expression=actions, awaitPromise=True, returnByValue=True)
            path.write_bytes(base64.b64decode(call("Page.captureScreenshot", format="png")["data"]))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
