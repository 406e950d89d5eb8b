"""A Singer target for the end-to-end tests: it passes each STATE's value on
to Meltano at once (a real target does so once the records before it are
safe), so Meltano commits state while the run goes on."""

import json
import sys

for line in sys.stdin:
    message = json.loads(line)
    if message.get("type") == "STATE":
        print(json.dumps(message["value"]), flush=True)
