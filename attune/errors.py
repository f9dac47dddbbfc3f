"""The one error type user input raises: it names the field and the rule it broke.

The CLI prints it as a single line and exits with code 2 (see attune/cli/main.py).
"""


class InputError(Exception):
    """Bad user input: a recipe, spec, flag or file that breaks a stated rule."""

    def __init__(self, field: str, rule: str):
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule
