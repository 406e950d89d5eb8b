"""Which Meltano command this process runs: only an extract-load command
(``meltano run``, ``el``, ``elt``) takes run locks, and its ``--force``
(or ``MELTANO_RUN_FORCE``) forces them. ``meltano state …`` and the rest
take none.
"""

from __future__ import annotations

import dataclasses

import click

#: Meltano's commands that run extract-load blocks under a state ID.
RUN_COMMANDS = frozenset({"run", "el", "elt"})


@dataclasses.dataclass(frozen=True)
class Invocation:
    runs_pipelines: bool
    force: bool = False


NOT_A_RUN = Invocation(runs_pipelines=False)

# The last answer click gave: state is touched on Meltano's main thread, where
# click's context lives, but a call from another thread must get the same answer.
_seen: Invocation | None = None


def current() -> Invocation:
    """The command of this process, from click's context (Meltano's CLI)."""
    global _seen
    found = _from_click()
    if found is not None:
        _seen = found
        return found
    return _seen or NOT_A_RUN


def _from_click() -> Invocation | None:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    chain = []
    while ctx is not None:
        chain.append(ctx)
        ctx = ctx.parent
    # chain[-1] is `meltano` itself; chain[-2] the command under it.
    if len(chain) < 2 or chain[-2].command.name not in RUN_COMMANDS:
        return NOT_A_RUN
    return Invocation(runs_pipelines=True, force=bool(chain[-2].params.get("force")))
