"""What a campaign tunes: the recipe file, moved to another cluster or model spec where asked."""

from __future__ import annotations

from attune.recipe import Recipe, load_recipe


def load_campaign_recipe(recipe_path: str, cluster: str | None = None, model_spec: str | None = None) -> Recipe:
    """The recipe at `recipe_path`, with `model_spec` for its model and adapted to `cluster` (a
    --cluster flag such as h200:128); its layout is checked before anything runs."""
    from attune.layout import adapt_to_cluster
    from attune.spec import parse_cluster_flag

    recipe = load_recipe(recipe_path)
    if model_spec:
        recipe = recipe.with_model_spec(model_spec)
    if cluster:
        recipe = recipe.on_cluster(parse_cluster_flag(cluster, recipe.cluster))
        config, _ = adapt_to_cluster(recipe.config, recipe.architecture, recipe.cluster)
        recipe = recipe.with_config(config)
    recipe.layout()
    return recipe
