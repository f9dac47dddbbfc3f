"""The tuner benchmark: every (recipe, planner, seed) campaign on the sim stack under one budget,
scored on the simulated ground truth (noise off) so seeds and planners are comparable.

    request.py   what to run: recipes, planner variants (ablations included), budget, seeds
    score.py     a finished campaign scored on the ground truth (flows/bench_pool.py runs it in a worker)
    truth.py     the evaluator: ground-truth throughput of a layout and the oracle (never a planner)
    summary.py   per recipe and planner: gains with a 95% interval, oracle share, GPU-hours, payback
    report.py    markdown tables, JSON, PNG plots
The flow that runs it is flows/bench.py; the command is `attune bench`. Results are simulated.
"""
