"""An option's value as the data source reads it, and the error that names a bad one. Apart from
options.py so security.py can use them without importing the options it is part of."""

from __future__ import annotations


class OptionError(ValueError):
    """A problem with an option, named: `txbroker option 'topic': ...`. `source` is the environment
    variable the value came from, when it did not come from the options."""

    def __init__(self, option: str, problem: str, source: str | None = None):
        self.option = option
        self.problem = problem
        self.source = source
        where = f" (from ${source})" if source else ""
        super().__init__(f"txbroker option '{option}'{where}: {problem}")

    def __reduce__(self):
        return type(self), (self.option, self.problem, self.source)


def option_value(options, name: str, default=None):
    value = options.get(name)  # the options dict is case-insensitive
    if value is None or str(value).strip() == "":
        return default
    return str(value).strip()
