"""The add-on's Meltano setting, ``state_backend.runlock.socket``: the
agent's socket, for a project whose runs reach their host's agent at a path
of its own (a container with the agent's socket mounted, say).

Declared through Meltano's ``meltano.settings`` entry points (pyproject.toml),
as a custom state backend declares its settings, so ``meltano config set
meltano state_backend.runlock.socket PATH`` (or
``MELTANO_STATE_BACKEND_RUNLOCK_SOCKET``) sets it. Meltano loads these at
start-up for every command, which imports the add-on and so hooks the start
of its jobs (job_start.py). Unset, the client's own
rule finds the socket, as the shim's does: ``RUNLOCK_SOCKET``, the agent's
configuration file, the default path. Set, it comes first, as ``--socket``
does for the shim.
"""

from __future__ import annotations

from meltano.core.error import ProjectNotFound
from meltano.core.project import Project
from meltano.core.setting_definition import SettingDefinition, SettingKind, SettingMissingError

SOCKET = SettingDefinition(
    name="state_backend.runlock.socket",
    label="runlock agent socket",
    description=(
        "Path of the runlock agent's socket (runlock+ state backends). "
        "Unset: RUNLOCK_SOCKET, else the agent's configuration file, else the default path"
    ),
    kind=SettingKind.STRING,
    env_specific=True,
)


def socket() -> str | None:
    """The active project's ``state_backend.runlock.socket``; None when it is
    unset or there is no project, so that the client's own rule applies."""
    try:
        value = Project.find().settings.get(SOCKET.name)
    except (ProjectNotFound, SettingMissingError):
        return None
    return str(value) if value else None


def state_backend_uri() -> str | None:
    """The active project's ``state_backend.uri``; None without a project."""
    try:
        value = Project.find().settings.get("state_backend.uri")
    except ProjectNotFound:
        return None
    return str(value) if value else None
