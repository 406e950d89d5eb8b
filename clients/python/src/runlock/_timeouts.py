"""How long the client waits on an agent, and how often it looks for the
next one: shared by the lease handle, its reattach thread and the one-shot calls.
"""

#: How long past the requested ``wait`` an answer may take before the agent is
#: deemed hung (backend requests time out after a few seconds on the agent).
REPLY_SLACK_S = 30.0
#: How long one page of ``list_keys`` may take: the agent reads up to a
#: thousand records for it, each bounded at 5 s, many at once.
LIST_PAGE_TIMEOUT_S = 60.0

#: Pause between reattach attempts while no agent answers: 50 ms, doubling
#: to 500 ms (as the shim does), so a restarted agent is found within half a second.
REATTACH_PAUSE_MIN_S = 0.05
REATTACH_PAUSE_MAX_S = 0.5

#: How long release() waits for a reattach in flight before cutting it off.
RELEASE_WAIT_S = 5.0
