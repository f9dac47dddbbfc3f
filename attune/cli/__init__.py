"""The `attune` command line. Each `cmd_*.py` module here adds one sub-command (see main.py)."""
