"""Flags shared by sub-commands: a recipe with --set / --cluster / --model-spec overrides, JSON output."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from attune.errors import InputError
from attune.layout import adapt_to_cluster, apply_levers
from attune.levers import lever_catalog, parse_set_flags
from attune.recipe import Recipe, load_recipe, recipe_from_dict, recipe_to_dict
from attune.spec import parse_cluster_flag


def add_recipe_arguments(parser: argparse.ArgumentParser, with_set: bool = True) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe TOML file")
    if with_set:
        parser.add_argument("--set", action="append", metavar="LEVER=VALUE", default=[],
                            help="override a config field (repeatable), e.g. --set parallelism.tensor_parallel_degree=4")
    parser.add_argument("--cluster", metavar="ACCEL:COUNT", help="run on another cluster, e.g. h200:128 "
                                                             "(default: the recipe's [cluster])")
    parser.add_argument("--model-spec", metavar="FILE", help="model spec file (JSON/TOML) replacing the recipe's model")
    parser.add_argument("--json", action="store_true", help="print JSON")


# Placeholders in the help are upper-case nouns (RECIPE, N, GPU_HOURS, FILE, URI, DIR): where the
# settings model names another, the help shows this one
SETTING_METAVARS = {"budget_gpu_hours": "GPU_HOURS", "stack": "STACK", "planner": "PLANNER"}


def add_settings_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """A flag for every campaign setting that has one (or for the settings named in `only`), from the
    settings model itself (attune.campaign.context.CampaignSettings: its flag, type, default and
    description; a default the description does not state is added to the help)."""
    from attune.campaign.context import CampaignSettings

    for name, info in CampaignSettings.model_fields.items():
        extra = dict(info.json_schema_extra or {})
        flag = extra.pop("flag", None)
        if flag is None or (only is not None and name not in only):
            continue
        helptext = info.description or ""
        if not info.is_required() and not extra.get("append") and "default" not in helptext:
            helptext = (helptext[:-1] + f"; default {info.default})" if helptext.endswith(")")
                        else helptext + f" (default {info.default})")
        if name in SETTING_METAVARS:
            extra["metavar"] = SETTING_METAVARS[name]
        kwargs: dict[str, Any] = {"dest": name, "help": helptext, **extra}
        if kwargs.get("metavar") is None:
            kwargs.pop("metavar", None)
        if kwargs.pop("append", False):
            kwargs |= {"action": "append", "default": []}
        else:
            kinds = [t for t in (getattr(info.annotation, "__args__", None) or (info.annotation,)) if t is not type(None)]
            kwargs["type"] = kinds[0]
            if kinds[0] is int:
                kwargs.setdefault("metavar", "N")
            if info.is_required():
                kwargs["required"] = True
            else:
                kwargs["default"] = info.default
        parser.add_argument(flag, **kwargs)


def settings_from_args(args: argparse.Namespace, **extra: Any):
    """The campaign's settings from the flags add_settings_arguments added (plus `extra` that other
    flags decide), or an InputError naming the flag of the first bad one. The flags that say where a
    campaign writes (--out, --store, --mlflow-uri, where the command has them) are checked here too:
    a campaign must not run for an hour and then fail to write its result."""
    from attune.campaign.context import CampaignSettings

    values = {name: getattr(args, name) for name, info in CampaignSettings.model_fields.items()
              if (info.json_schema_extra or {}).get("flag") and hasattr(args, name)}
    settings = CampaignSettings.of(**values, **extra)
    check_destination_flags(args)
    return settings


def check_destination_flags(args: argparse.Namespace) -> None:
    """Refuse a bad --out (a file to write), --store or --mlflow-uri before anything runs or is created."""
    from attune.store import store_location

    if getattr(args, "out", None):
        check_out_file(args.out)
    if getattr(args, "store", None):
        store_location(args.store)
    if getattr(args, "mlflow_uri", None):
        check_tracking_uri(args.mlflow_uri)


def check_out_file(out: str, flag: str = "--out") -> Path:
    """A file path to write later: not a folder, in a folder that exists (a typo in the folder
    would otherwise be created, or fail only at the end)."""
    path = Path(out)
    if path.is_dir():
        raise InputError(flag, f"{out} is a directory; name the file to write, e.g. {path / 'shipped.toml'}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise InputError(flag, f"the folder {parent} does not exist")
    if not parent.is_dir():
        raise InputError(flag, f"{parent} is not a folder")
    return path


# What MLflow's tracking client opens (a scheme may carry a driver: postgresql+psycopg2://...).
TRACKING_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")


def check_tracking_uri(uri: str, flag: str = "--mlflow-uri") -> str:
    """A tracking URI MLflow can open: a known scheme, a host for http(s), a path for sqlite/file.
    Without this, a typo starts a campaign and fails (or tracks into a stray folder) later."""
    if uri in ("databricks", "databricks-uc"):
        return uri
    parts = urlsplit(uri)
    scheme = parts.scheme.lower().split("+")[0]
    example = "e.g. sqlite:///path/mlflow.db or http://host:5000"
    if not parts.scheme:
        raise InputError(flag, f"{uri!r} is not a URI; {example}")
    if scheme not in TRACKING_SCHEMES:
        raise InputError(flag, f"{parts.scheme}:// is not a tracking URI scheme MLflow opens "
                               f"({', '.join(TRACKING_SCHEMES)}); {example}")
    if scheme in ("http", "https") and not parts.hostname:
        raise InputError(flag, f"{uri!r} names no host; {example}")
    if scheme in ("sqlite", "file") and not parts.path.strip("/"):
        raise InputError(flag, f"{uri!r} names no file; {example}")
    return uri


def add_sim_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """--cluster-seed and --world: which simulated cluster (attune/sim/worlds.py)."""
    parser.add_argument("--cluster-seed", type=int, default=0, metavar="N",
                        help="which simulated cluster: 0 is the reference the public measurements pin (default), "
                             "1, 2, ... its siblings, which depart from it as far as --world says")
    parser.add_argument("--world", default="realistic", metavar="WORLD",
                        help="easy | realistic | hard: how far a sibling cluster departs from the public "
                             "estimator (default realistic; no effect on cluster 0)")


def check_sim_cluster_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The sim stack's options from the flags, refused in one line where they are wrong."""
    from attune.sim.worlds import world_scale

    if args.cluster_seed < 0:
        raise InputError("--cluster-seed", f"must be >= 0, got {args.cluster_seed}")
    world_scale(args.world)
    return {"cluster_seed": args.cluster_seed, "world": args.world}


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    """The recipe named on the command line with its overrides applied and re-validated.

    Lever overrides go through apply_levers (so compensations apply: the global batch and world size
    hold); other fields are set as given.
    """
    recipe = load_recipe(args.recipe)
    if getattr(args, "model_spec", None):
        recipe = recipe.with_model_spec(args.model_spec)
    if getattr(args, "cluster", None):
        recipe = recipe.on_cluster(parse_cluster_flag(args.cluster, recipe.cluster))
        config, _changes = adapt_to_cluster(recipe.config, recipe.architecture, recipe.cluster)
        recipe = _revalidate(recipe.with_config(config), "--cluster")
    sets = parse_set_flags(getattr(args, "set", None))
    if sets:
        catalog = lever_catalog()
        moves = {k: v for k, v in sets.items() if k in catalog and (catalog[k].speed_only or catalog[k].numerics)}
        config = dict(recipe.config) | {k: v for k, v in sets.items() if k not in moves}
        if moves:
            config = apply_levers(config, moves, recipe.architecture, recipe.cluster)
        recipe = _revalidate(recipe.with_config(config), "--set")
    return recipe


def _revalidate(recipe: Recipe, flag: str) -> Recipe:
    try:
        return recipe_from_dict(recipe_to_dict(recipe), origin=flag)
    except InputError as err:
        raise InputError(err.field, err.rule) from None


def emit(payload: Any, as_json: bool, text: str | None = None) -> None:
    """JSON on stdout with --json, else the human text (or pretty JSON when there is none)."""
    if as_json or text is None:
        json.dump(payload, sys.stdout, indent=None if as_json else 2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")


def quiet_local_prefect(log_level: str = "CRITICAL") -> None:
    """Environment defaults for a command that runs Prefect flows on the ephemeral local API.

    Our own progress lines say what happens; Prefect's console logs (tracebacks of retried trials
    included) would bury them, so PREFECT_LOGGING_LEVEL=INFO brings them back. The ephemeral API
    starts in ~10 s, but its first start on a fresh machine migrates a new database and takes
    longer than Prefect's 20 s default (seen: a first `attune bench` timed out), so allow 120 s.
    Values the user set win.
    """
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", log_level)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # Prefect creates its home without parents, and with no home its database fails deep inside
    # the API's start-up (a 120 s wait, then a traceback), so a PREFECT_HOME in a new folder is made here
    home = os.environ.get("PREFECT_HOME")
    if home:
        try:
            Path(home).expanduser().mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError("PREFECT_HOME", f"cannot create {home}: {err.strerror}") from None
