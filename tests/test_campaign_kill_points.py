"""Kill a sim campaign at every save point in turn, resume it, and check after each resume: the
budget never exceeded, every trial charged once (spent = trials + lost + gate), one MLflow run per
trial, the campaign's moves in the lessons ledger once, and the same trials and result as an uninterrupted
campaign with the same seed (tests/kill_points.py says how a kill is made)."""

from __future__ import annotations

import json

import pytest
from kill_points import check_resumed, client_env, fresh_home, run_campaign
from prefect_server import prefect_server

from conftest import REPO

# Every phase in few trials: 2 baseline replicates, a short search, one confirmation, the gate, ship.
ARGS = [str(REPO / "recipes" / "public" / "llama3_8b.toml"), "--budget-gpu-hours", "30", "--replicates", "2",
        "--max-trials", "3", "--gate-steps", "20", "--json", "--quiet"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One Prefect server for every run, and the uninterrupted campaign: its result and save count."""
    root = tmp_path_factory.mktemp("kill-points")
    with prefect_server(root) as server:
        env = client_env(server.api_url)
        home = root / "reference" / ".attune"
        home.mkdir(parents=True)
        count = root / "saves.txt"
        done = run_campaign(home, ARGS, env, count_file=count)
        assert done.returncode == 0, done.stderr
        yield {"root": root, "env": env, "home": home, "result": json.loads(done.stdout),
               "saves": int(count.read_text())}


def _kill_and_resume(reference, at: int, mode: str) -> list[str]:
    home = fresh_home(reference["root"], f"{mode}-{at:03d}", reference["home"])
    killed = run_campaign(home, ARGS, reference["env"], kill_at=at, mode=mode)
    if killed.returncode != 137:
        return [f"the kill at save {at} ({mode}) did not happen: exit {killed.returncode}\n{killed.stderr[-2000:]}"]
    resumed = run_campaign(home, ARGS, reference["env"])
    if resumed.returncode != 0:
        return [f"resume after save {at} ({mode}) exited {resumed.returncode}:\n{resumed.stderr[-2000:]}"]
    return check_resumed(home, reference["result"], reference["home"])


@pytest.mark.slow   # its fixture runs the ~40 s reference campaign that only the slow kill test needs
def test_the_reference_campaign_covers_every_phase(reference):
    result = reference["result"]
    assert result["shipped"] and result["gate"]["passed"], result["stop_reason"]
    assert reference["saves"] >= 15   # pending and record per trial, MLflow ids, phases, gate, lessons


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["after", "before"])
def test_kill_at_every_save_point_then_resume(reference, mode):
    failures = {at: problems for at in range(1, reference["saves"] + 1)
                if (problems := _kill_and_resume(reference, at, mode))}
    assert not failures, "\n".join(f"save {at} ({mode}): {'; '.join(p)}" for at, p in failures.items())
