"""The simulated cluster: an analytic step model of dense and MoE decoders under every lever.

Public (planners may use): attune.sim.estimator (estimate, estimate_many, estimate_wall_time_s),
attune.sim.space_arrays (space_arrays, iter_space), attune.sim.calibration.
Evaluator only: attune.sim.oracle (oracle, truth_tps). Never for planners: attune.sim.ground_truth.
"""
