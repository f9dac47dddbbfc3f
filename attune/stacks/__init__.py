"""Stacks: where trials run (sim, torchtitan). Each returns a TrialResult; see base.py."""
