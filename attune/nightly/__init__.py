"""Nightly re-tuning: which production recipes to re-tune tonight, and why (plain functions).

    registry      the production recipes (deployments/production.toml) and their nightly budgets
    fingerprint   the stack a recipe runs on tonight: the recipe's [stack] (sim) or the environment
    shipped       the last shipped recipe for a model on a cluster, from the recipe store
    regression    is the re-measured shipped recipe slower than it was, beyond the noise band?
    decide        re-tune or not, with the reasons in words
    ledger        what each night decided, kept in the store beside the recipes
    report        the markdown artifacts the Prefect UI shows
"""
