"""A Singer tap for the end-to-end tests, run by Meltano's own Python.

It records the state Meltano handed it (``seen PID STATE``) and that it
started (``started PID``) in the file ``$TAP_SIDE``, emits one record and the
state ``{"run": $TAP_TAG}``, then holds until the file ``$TAP_SIDE.release``
exists (60 s at most) and emits ``{"run": $TAP_TAG, "step": "last"}``. With
``$TAP_HOLD_FIRST`` set, it holds before its first state instead, so that
its run writes no state until released. With ``$TAP_FAIL`` set, it fails
(exit 1) as soon as it has recorded that it started: a real failure.
"""

import json
import os
import sys
import time


def emit(message):
    print(json.dumps(message), flush=True)


def main(argv):
    if "--discover" in argv:
        emit({"streams": []})
        return
    if "--about" in argv:
        emit({"name": "tap-counter"})
        return
    side = os.environ["TAP_SIDE"]
    tag = os.environ.get("TAP_TAG", "untagged")
    state = None
    if "--state" in argv:
        with open(argv[argv.index("--state") + 1]) as handle:
            state = json.load(handle)
    with open(side, "a") as out:
        out.write(f"seen {os.getpid()} {json.dumps(state)}\nstarted {os.getpid()}\n")
    if os.environ.get("TAP_FAIL"):
        sys.exit(1)
    emit({"type": "SCHEMA", "stream": "s", "schema": {"properties": {"id": {"type": "integer"}}}, "key_properties": ["id"]})
    emit({"type": "RECORD", "stream": "s", "record": {"id": 1}})
    hold_first = bool(os.environ.get("TAP_HOLD_FIRST"))
    if not hold_first:
        emit({"type": "STATE", "value": {"run": tag}})
    deadline = time.monotonic() + 60
    while not os.path.exists(side + ".release") and time.monotonic() < deadline:
        time.sleep(0.05)
    if hold_first:
        emit({"type": "STATE", "value": {"run": tag}})
    emit({"type": "STATE", "value": {"run": tag, "step": "last"}})


if __name__ == "__main__":
    main(sys.argv[1:])
