"""`attune campaigns`: list, show, resume and discard the campaigns under $ATTUNE_HOME, a damaged
state included."""

from __future__ import annotations

import json

from conftest import REPO, assert_one_line_error

from attune.campaign.context import CampaignSettings
from attune.campaign.engine import close_campaign, open_campaign
from attune.campaign.inputs import load_campaign_recipe
from attune.files import try_lock

PUBLIC_8B = REPO / "recipes" / "public" / "llama3_8b.toml"


def _stopped_campaign(home, budget=20.0):
    """A campaign opened (its state saved in the baseline phase) and let go, as a stop leaves it."""
    c = open_campaign(load_campaign_recipe(str(PUBLIC_8B)), CampaignSettings.of(budget_gpu_hours=budget,
                                                                                 gate_steps=20), home=home)
    close_campaign(c)
    return c.directory


def test_list_and_show_stopped_running_and_damaged_campaigns(cli, tmp_path):
    home = tmp_path / ".attune"
    assert "no campaigns" in cli("campaigns", check=True).stdout
    stopped = _stopped_campaign(home)
    running = _stopped_campaign(home, budget=30.0)
    damaged = home / "campaigns" / "broken-0123456789ab"
    damaged.mkdir(parents=True)
    (damaged / "state.json").write_text('{"campaign_id": ')
    holder = try_lock(running / ".lock")    # as a process running it holds it
    try:
        rows = {r["id"]: r for r in json.loads(cli("campaigns", "--json", check=True).stdout)}
        text = cli("campaigns", check=True).stdout
    finally:
        holder.close()
    assert rows[stopped.name]["status"] == "stopped" and rows[running.name]["status"] == "running"
    assert rows[damaged.name]["status"] == "damaged" and "not valid JSON" in rows[damaged.name]["problem"]
    assert rows[stopped.name]["cluster"] == "a100:64" and rows[stopped.name]["budget_gpu_hours"] == 20.0
    assert all(name in text for name in rows)
    shown = json.loads(cli("campaigns", "show", stopped.name[-12:], "--json", check=True).stdout)
    assert shown["id"] == stopped.name and shown["trials"] == []
    assert_one_line_error(cli("campaigns", "show", "broken"), "cannot be resumed", "attune campaigns discard")
    assert_one_line_error(cli("campaigns", "show", "llama3"), "names 2 campaigns")
    assert_one_line_error(cli("campaigns", "show", "nope"), "no campaign 'nope'")
    assert_one_line_error(cli("campaigns", "discard"), "needs the campaign's ID")


def test_discard_removes_a_campaign_unless_it_is_running(cli, tmp_path):
    home = tmp_path / ".attune"
    folder = _stopped_campaign(home)
    holder = try_lock(folder / ".lock")
    try:
        assert_one_line_error(cli("campaigns", "discard", folder.name), "is running in another process")
    finally:
        holder.close()
    assert folder.is_dir()
    cli("campaigns", "discard", folder.name, check=True)
    assert not folder.exists()


def test_resume_runs_the_same_campaign_to_its_end(cli, tmp_path):
    folder = _stopped_campaign(tmp_path / ".attune")
    result = json.loads(cli("campaigns", "resume", folder.name, "--json", "--quiet", check=True, timeout=600).stdout)
    assert result["campaign_dir"] == str(folder) and result["budget_gpu_hours"] == 20.0
    assert 0 < result["gpu_hours_used"] <= 20.0
    rows = json.loads(cli("campaigns", "--json", check=True).stdout)
    assert [(r["id"], r["status"]) for r in rows] == [(folder.name, "done")]
    assert rows[0]["best_gain"] == result["gain"]
