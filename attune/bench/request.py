"""What a benchmark runs: recipes x planner variants x seeds, every campaign under the same budget.

A planner variant is a registered planner, optionally with search rules switched off:
`attune-no-lessons` is the `attune` planner without its lessons catalog (an ablation), and
`--ablations` adds one such variant per rule. `--disable-rule R` applies to every `attune` variant.

Each seed runs on its own simulated cluster of the world (`--world`): seed s on the s-th sibling of
the reference cluster (cluster_seed 1, 2, ...) on which the recipe's own layout runs (a campaign
needs a working recipe; in a hard world a recipe near the memory edge runs out of memory on some),
so every seed is another cluster, not only another noise draw. All planners share the clusters.
`tuned:RECIPE` benchmarks the recipe moved to the best layout the gate passes on each seed's
cluster: a well-tuned recipe, where nothing is left to find and a shipped "gain" is a false one.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from attune.campaign.context import CampaignSettings
from attune.errors import InputError
from attune.sim.worlds import DEFAULT_WORLD, world_scale

# The default: 40 GPU-hours for every 64 GPUs of the recipe's cluster.
DEFAULT_GPU_HOURS_PER_64_GPUS = 40.0
ABLATION_PREFIX = "attune-no-"
TUNED_PREFIX = "tuned:"


class PlannerVariant(BaseModel):
    model_config = ConfigDict(frozen=True)
    label: str                          # what tables and plots call it
    planner: str                        # the registered planner name
    disabled_rules: tuple[str, ...] = ()


class BenchRecipe(BaseModel):
    model_config = ConfigDict(frozen=True)
    path: str                           # the recipe file as given (absolute)
    label: str                          # recipe name @ cluster
    cluster: str | None = None          # --cluster applied to it
    model_spec: str | None = None       # --model-spec applied to it
    gpus: int
    budget_gpu_hours: float
    tuned: bool = False                 # moved to the best layout the gate passes on each cluster


class BenchCell(BaseModel):
    """One campaign of the benchmark."""
    model_config = ConfigDict(frozen=True)
    recipe: BenchRecipe
    variant: PlannerVariant
    seed: int
    world: str = DEFAULT_WORLD
    cluster_seed: int = 1               # the simulated cluster this seed runs on (attune.bench.truth)
    tuned_path: str | None = None       # the tuned recipe file for this cell's cluster (tuned recipes)
    steps_per_trial: int = 10
    replicates: int = 3
    gate_steps: int | None = None
    gate_seed: int | None = 0           # one proxy seed for every campaign: a candidate gets the same
                                        # verdict whichever planner and seed found it (None: the seed's)

    @property
    def key(self) -> str:
        return f"{self.recipe.label}|{self.variant.label}|{self.seed}"

    @property
    def path(self) -> str:
        """The recipe file the campaign tunes (already on its cluster when tuned)."""
        return self.tuned_path or self.recipe.path

    @property
    def cluster(self) -> str | None:
        return None if self.tuned_path else self.recipe.cluster

    def settings(self):
        """What the cell's campaign is asked (on the sim stack, on its own simulated cluster)."""
        from attune.campaign.context import CampaignSettings
        return CampaignSettings.of(budget_gpu_hours=self.recipe.budget_gpu_hours, stack="sim",
                                   planner=self.variant.planner, seed=self.seed, steps_per_trial=self.steps_per_trial,
                                   replicates=self.replicates, disabled_rules=self.variant.disabled_rules,
                                   gate_steps=self.gate_steps, gate_seed=self.gate_seed,
                                   stack_options={"cluster_seed": self.cluster_seed, "world": self.world})


def oracle_key(label: str, cluster_seed: int) -> str:
    return f"{label}#{cluster_seed}"


def default_budget(gpus: int, share: float = 1.0) -> float:
    """The convention budget of a cluster (40 GPU-hours per 64 GPUs), or `share` of it (the budget curve)."""
    return share * DEFAULT_GPU_HOURS_PER_64_GPUS * gpus / 64.0


def _rules() -> tuple[str, ...]:
    from attune.planners.attune_planner import RULES
    return RULES


def parse_planners(text: str, disable_rules: list[str] | None = None, ablations: bool = False) -> list[PlannerVariant]:
    """`attune,random,bayes,estimator-topk` (plus `attune-no-RULE` entries) as planner variants."""
    from attune.planners.registry import planner_names

    rules, known = _rules(), planner_names()
    extra = tuple(disable_rules or ())
    bad = [r for r in extra if r not in rules]
    if bad:
        raise InputError("--disable-rule", f"unknown rule(s) {', '.join(bad)}; rules: {', '.join(rules)}")
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("--planners", "name at least one planner")
    if ablations:
        names += ["attune"] * ("attune" not in names) + [ABLATION_PREFIX + r for r in rules]
    variants: list[PlannerVariant] = []
    for name in names:
        if name.startswith(ABLATION_PREFIX):
            rule = name.removeprefix(ABLATION_PREFIX)
            if rule not in rules:
                raise InputError("--planners", f"{name!r}: unknown rule {rule!r}; rules: {', '.join(rules)}")
            variant = PlannerVariant(label=name, planner="attune", disabled_rules=(rule,))
        elif name in known:
            variant = PlannerVariant(label=name, planner=name)
        else:
            raise InputError("--planners", f"unknown planner {name!r}; choose from {', '.join(known)} "
                                           f"or {ABLATION_PREFIX}RULE")
        if variant.planner == "attune" and extra:
            rules_off = tuple(sorted(set(variant.disabled_rules) | set(extra)))
            variant = PlannerVariant(label=f"attune-no-{'+'.join(rules_off)}", planner="attune",
                                     disabled_rules=rules_off)
        if variant.planner == "llm":
            raise InputError("--planners", "the llm planner needs an endpoint; benchmark it with `attune tune`")
        if variant.label not in [v.label for v in variants]:
            variants.append(variant)
    return variants


def bench_recipes(paths: list[str], cluster: str | None = None, model_spec: str | None = None,
                  budget_gpu_hours: float | None = None, budget_share: float = 1.0) -> list[BenchRecipe]:
    """Load and validate every recipe up front (a bad one is refused before any campaign runs)."""
    from attune.campaign.inputs import load_campaign_recipe

    if not paths:
        raise InputError("--recipes", "name at least one recipe file")
    if budget_gpu_hours is not None and budget_gpu_hours <= 0:
        raise InputError("--budget-gpu-hours", f"must be > 0, got {budget_gpu_hours:g}")
    if not 0 < budget_share < 1_000:
        raise InputError("--budget-share", f"must be > 0 (and < 1000), got {budget_share:g}")
    out: list[BenchRecipe] = []
    for raw in paths:
        tuned = raw.startswith(TUNED_PREFIX)
        path = Path(raw.removeprefix(TUNED_PREFIX)).resolve()
        recipe = load_campaign_recipe(str(path), cluster, model_spec)
        name = f"{recipe.name.removesuffix('-public')}-tuned" if tuned else recipe.name
        label = f"{name}@{recipe.cluster.label}"
        if label in [r.label for r in out]:
            raise InputError("--recipes", f"{raw}: the same recipe and cluster twice ({label})")
        budget = budget_gpu_hours if budget_gpu_hours is not None else default_budget(recipe.cluster.gpus, budget_share)
        out.append(BenchRecipe(path=str(path), label=label, cluster=cluster,
                               model_spec=str(Path(model_spec).resolve()) if model_spec else None,
                               gpus=recipe.cluster.gpus, budget_gpu_hours=budget, tuned=tuned))
    return out


def write_tuned_recipe(recipe: BenchRecipe, oracle: dict, folder: Path) -> str:
    """A tuned recipe on the oracle's cluster (its `tuned_levers`, attune.bench.truth.oracle_json) as a file."""
    from attune.campaign.inputs import load_campaign_recipe
    from attune.recipe import write_recipe
    from attune.space import recipe_at

    base = load_campaign_recipe(recipe.path, recipe.cluster, recipe.model_spec)
    levers = oracle.get("tuned_levers") or base.layout().levers()
    name = recipe.label.split("@")[0]
    path = folder / f"{name}-{base.cluster.label.replace(':', 'x')}-cluster{oracle['cluster_seed']}.toml"
    write_recipe(recipe_at(base, levers, name=name), path)
    return str(path)


def _clusters_of(recipe: BenchRecipe, seeds: int, world: str, clusters: dict[str, list[int]] | None) -> list[int]:
    """The recipe's cluster seeds: the cluster search's when it ran, else s + 1 for seed s. An empty
    list is its answer, not a missing one: clusters 1..N would be ones the recipe does not run on
    (and a tuned recipe has no tuned file there), so the recipe is refused by name."""
    if clusters is None or recipe.label not in clusters:
        return [s + 1 for s in range(seeds)]
    if not clusters[recipe.label]:
        raise InputError("--recipes", f"{recipe.label}: its own layout runs on none of the {world!r} world's "
                                      f"sibling clusters tried (a campaign needs a recipe that runs); drop it "
                                      f"or benchmark it in an easier world")
    return clusters[recipe.label]


def bench_cells(recipes: list[BenchRecipe], variants: list[PlannerVariant], seeds: int, steps: int = 10,
                replicates: int = 3, gate_steps: int | None = None, gate_seed: int | None = 0,
                world: str = DEFAULT_WORLD, clusters: dict[str, list[int]] | None = None,
                tuned_paths: dict[str, str] | None = None) -> list[BenchCell]:
    """Every campaign. `clusters` maps a recipe's label to the cluster_seed of each seed (default
    s + 1; a recipe it maps to none is refused); `tuned_paths` maps oracle_key(label, cluster_seed)
    of a tuned recipe to its file."""
    if seeds < 1:
        raise InputError("--seeds", f"must be >= 1, got {seeds}")
    world_scale(world)
    # each campaign's own settings, refused as `attune tune` refuses them (the budget is checked per recipe)
    CampaignSettings.of(budget_gpu_hours=1.0, steps_per_trial=steps, replicates=replicates, gate_steps=gate_steps)
    # Seed-major, recipes innermost: campaigns that may ship the same candidate (one planner, one
    # recipe, two seeds) run far apart, so the second finds the first's gate verdict in the cache
    # instead of training the same proxy runs at the same time in the other worker.
    cluster = {r.label: _clusters_of(r, seeds, world, clusters) for r in recipes}
    tuned_paths = tuned_paths or {}
    return [BenchCell(recipe=r, variant=v, seed=s, world=world, cluster_seed=cluster[r.label][s],
                      tuned_path=tuned_paths.get(oracle_key(r.label, cluster[r.label][s])),
                      steps_per_trial=steps, replicates=replicates, gate_steps=gate_steps, gate_seed=gate_seed)
            for s in range(seeds) for v in variants for r in recipes if s < len(cluster[r.label])]
