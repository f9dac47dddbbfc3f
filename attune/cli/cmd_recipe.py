"""`attune recipe show`: a recipe's resolved model, cluster and layout; `attune models`: the catalog."""

from __future__ import annotations

import argparse

from attune.cli.common import add_recipe_arguments, emit, recipe_from_args
from attune.recipe import dump_recipe
from attune.spec import catalog_model, model_names


def register(subparsers: argparse._SubParsersAction) -> None:
    recipe = subparsers.add_parser("recipe", help="inspect a recipe file")
    sub = recipe.add_subparsers(dest="recipe_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="the resolved layout (dp_shard, grad-accum, ...) of a recipe")
    add_recipe_arguments(show)
    show.set_defaults(func=_show)

    models = subparsers.add_parser("models", help="list the built-in model catalog")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(func=_models)


def _show(args: argparse.Namespace) -> int:
    recipe = recipe_from_args(args)
    arch = recipe.architecture
    payload = {"name": recipe.name, "model": recipe.model_name, "cluster": recipe.cluster.label,
               "total_params_b": round(arch.total_params / 1e9, 2),
               "active_params_b": round(arch.active_params / 1e9, 2),
               "layout": recipe.layout().as_dict(), "recipe_toml": dump_recipe(recipe)}
    text = "\n".join([f"{recipe.name}: {recipe.model_name} on {recipe.cluster.label} "
                      f"({payload['total_params_b']}B params, {payload['active_params_b']}B active)"]
                     + [f"  {k} = {v}" for k, v in payload["layout"].items()])
    emit(payload, args.json, text)
    return 0


def _models(args: argparse.Namespace) -> int:
    rows = []
    for name in model_names():
        spec = catalog_model(name)
        rows.append({"name": name, "moe": spec.is_moe, "total_params_b": round(spec.total_params / 1e9, 1),
                     "active_params_b": round(spec.active_params / 1e9, 1)})
    text = "\n".join(f"{r['name']:18} {'MoE  ' if r['moe'] else 'dense'} {r['total_params_b']:>7}B total "
                     f"{r['active_params_b']:>6}B active" for r in rows)
    emit(rows, args.json, text)
    return 0
