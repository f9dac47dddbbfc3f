"""Finished campaigns in the recipe store: what `--warm-start auto` starts from on another machine.

A campaign's folder lives under the ATTUNE_HOME of the machine that ran it; a nightly re-tune on a
fresh worker, or a teammate's re-tune, has none. So a finished campaign also leaves its state in the
recipe store (a folder or S3 alike), one object written whole: `campaigns/<recipe name>/<campaign
id>.json`, holding when it finished and its state. `--warm-start auto` takes the latest finished campaign
of the recipe under ATTUNE_HOME or in the store, whichever finished later; one of the store's it
copies into ATTUNE_HOME as a finished campaign folder, so every later look (the campaign's identity on
a resume, `attune campaigns`) finds it there, whatever the store holds by then.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from attune.campaign.state import CampaignState, campaign_folder
from attune.files import atomic_write_text
from attune.store.base import check_key, stored

PREFIX = "campaigns/"


class StoredCampaign(BaseModel):
    campaign: str       # the campaign's folder name: <recipe name>-<campaign id>
    recipe: str
    finished: str       # ISO time, UTC: the latest is what `auto` takes
    state: dict


def key(recipe_name: str, folder_name: str) -> str:
    return check_key(f"{PREFIX}{recipe_name}/{folder_name}.json")


def keep(c, store_uri: str | None) -> bool:
    """Put the finishing campaign `c` (attune.campaign.context.Campaign) in the store, as done; False
    where its recipe name cannot be a store key. A resumed campaign's object replaces the one it
    wrote before it was killed."""
    from attune.store import open_store
    try:
        name = key(c.recipe.name, c.directory.name)
    except ValueError:
        return False
    state = c.state.model_copy(update={"phase": "done"}).model_dump(mode="json")
    row = StoredCampaign(campaign=c.directory.name, recipe=c.recipe.name, state=state,
                         finished=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    open_store(store_uri).blobs.write(name, row.model_dump_json().encode(), "application/json")
    return True


def latest(store_uri: str | None, recipe_name: str) -> StoredCampaign | None:
    """The latest finished campaign of this recipe name in the store; objects that cannot be read as
    one are passed over."""
    from attune.store import open_store
    try:
        prefix = check_key(f"{PREFIX}{recipe_name}") + "/"
    except ValueError:
        return None
    found = []
    for _key, data in stored(open_store(store_uri).blobs, prefix):
        try:
            row = StoredCampaign.model_validate(json.loads(data))
            CampaignState.model_validate(row.state)
        except (ValidationError, ValueError):
            continue
        if row.recipe == recipe_name and row.state.get("phase") == "done" and _safe(row.campaign, recipe_name):
            found.append(row)
    return max(found, key=lambda r: r.finished) if found else None


def _safe(folder_name: str, recipe_name: str) -> bool:
    """A folder name from the store becomes a path only if it is one safe name, of this recipe's."""
    try:
        check_key(folder_name)
    except ValueError:
        return False
    return "/" not in folder_name and folder_name.startswith(f"{recipe_name}-")


def fetch(store_uri: str | None, recipe_name: str, home: Path | None = None) -> Path | None:
    """Copy the store's latest finished campaign of this recipe into ATTUNE_HOME; its folder, or None."""
    row = latest(store_uri, recipe_name)
    return copy_home(row, recipe_name, home) if row is not None else None


def copy_home(row: StoredCampaign, recipe_name: str, home: Path | None = None) -> Path:
    """A campaign of the store (from `latest`: its name is safe) as a finished campaign folder under
    ATTUNE_HOME; one already there is left as it is."""
    cid = row.campaign.removeprefix(f"{recipe_name}-")
    folder = campaign_folder(recipe_name, cid, home)
    if not (folder / "state.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "state.json", json.dumps(row.state))
    return folder
