"""Planners choose the next trial from the measured history only (see base.py).

No planner may import attune.sim.ground_truth (tests/test_sim_honesty.py enforces it); a planner
may consult the public estimator, attune.sim.estimator.
"""
