"""ATTUNE: tune LLM training recipes inside a GPU-hour budget, ship only what the gate verifies."""

__version__ = "0.1.0"
