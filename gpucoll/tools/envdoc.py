"""docs/environment.md, made from the declarations of gpucoll/base/config.py so that the page
cannot drift from them (tests/test_env_vars.py compares the two)::

    gpucoll environment > docs/environment.md        # or: make docs-environment
"""
from ..base import config

_KINDS = {"bool": "bool", "int": "integer", "float": "number", "size": "bytes", "str": "text",
          "choice": "one of", "choices": "list of"}

INTRO = """\
# Environment variables

Every `GPUCOLL_*` variable, as `gpucoll/base/config.py` declares it: the one place that reads them.
A value that does not parse raises `ConfigError` naming the variable and what it accepts; a
`GPUCOLL_*` name that nothing declares is reported at start-up (a typo?). `gpucoll info` prints
the values in effect. This page is made from the declarations by `gpucoll environment`
(`make docs-environment`); edit the declarations, not the page.
"""


def default(var):
    """The default as a user would write it; None when the default is to be unset."""
    value = var.default
    if value is None or value == ():
        return None
    if var.kind == "bool":
        return "1" if value else "0"
    if var.kind == "size":
        for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
            if value and value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
        return str(value)
    if var.kind == "choices":
        return ",".join(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cell(text):
    return str(text).replace("|", "\\|")


def table(variables):
    lines = ["| variable | type | default | accepts | meaning |", "|---|---|---|---|---|"]
    for var in variables:
        value = default(var)
        cells = [f"`{var.name}`", _KINDS[var.kind], "unset" if value is None else f"`{value}`", var.allowed(),
                 var.help]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def page():
    """The whole of docs/environment.md."""
    settings = [var for var in config.ALL if not var.launcher]
    provided = [var for var in config.ALL if var.launcher]
    secret = ", ".join(f"`{var.name}`" for var in config.ALL if var.secret)
    return (f"{INTRO}\n## Settings\n\n{table(settings)}\n"
            "## Set by gpurun for each rank\n\n"
            "gpurun gives every rank these (launcher/env.py), beside `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,\n"
            "`LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`. The value of a secret variable\n"
            f"({secret}) is never shown: `gpucoll info`, errors and logs mask it.\n\n"
            f"{table(provided)}")
