"""The event follower of a lease: reads what the agent holding the leases
says (``lost``, ``renewed``, ``restarting``) and notices when it goes, and
tells the lease handle, which keeps the state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import messages
from ._connection import Connection
from .errors import RunlockError
from .messages import AgentMessage

if TYPE_CHECKING:
    from .api import Lease


class EventFollower:
    """Follows the events of each connection that holds ``lease``'s leases."""

    def __init__(self, lease: Lease):
        self._lease = lease

    def follow(self, conn: Connection) -> None:
        # Handlers bound to their connection, so one left behind cannot act
        # for the lease once another holds it. Never called with the lease's
        # lock held: set_handlers replays what arrived before, and the
        # handlers take it.
        conn.set_handlers(
            lambda message: self._on_event(conn, message),
            lambda error: self._on_close(conn, error),
        )

    def _on_event(self, conn: Connection, message: AgentMessage) -> None:
        lease = self._lease
        if not lease._held_through(conn):
            return  # an agent left behind: the leases are another's now
        if isinstance(message, messages.Lost):
            lease._lose_one(message.event)
        elif isinstance(message, messages.Renewed):
            lease._renewed(message.lease_id, message.valid_for_ms)
        elif isinstance(message, messages.Restarting):
            lease.agent_restarting = True
            if conn.welcome.leases_survive_agent:
                # Stop using this agent: it is handing the leases over (SPEC 5.3).
                lease._reattacher.agent_lost(conn, f"the agent at {lease._path} is restarting")
            else:
                # memory:// locks die with the agent (SPEC 5.3).
                lease._lose_all("restarting", "the agent is restarting and its locks end with it")

    def _on_close(self, conn: Connection, error: RunlockError) -> None:
        lease = self._lease
        if not lease._held_through(conn):
            return
        if conn.welcome.leases_survive_agent:
            lease._reattacher.agent_lost(conn, f"lost the agent: {error.message}")
        else:
            lease._lose_all("agent_gone", f"lost the agent: {error.message}")
