"""The verdict on one shape: Meltano's answer against runlock's.

For a ``meltano run``/``el``/``elt`` shape:
- the same keys (order aside, each once) pass;
- Meltano errors or forms no state ID and runlock refuses (exit 64): pass;
- Meltano forms IDs and runlock refuses: a pass only if the shape declares
  that refusal and runlock's message names the input it gives;
- anything else fails: different keys, keys where Meltano errors, a crash,
  another exit code.

For a state_backend shape: runlockd's header must list exactly the settings
Meltano finds (in meltano.yml, .env or the environment), each from the same
source (and variable); the TOML must carry the non-secret values Meltano
reads; no secret may appear; and with no usable URI runlockd must refuse (78).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

REFUSED = 64
NO_CONFIG = 78


@dataclass
class Answer:
    """What a program said about a shape."""

    code: Optional[int]  # None: it did not finish in time
    stdout: str
    stderr: str


@dataclass
class MeltanoAnswer:
    error: Optional[str]
    state_ids: List[str]

    def text(self) -> str:
        return f"error: {self.error}" if self.error is not None else f"keys {sorted(set(self.state_ids))}"


@dataclass
class Verdict:
    passed: bool
    category: str
    meltano: str
    runlock: str


def meltano_answer(reply: Dict[str, Any]) -> MeltanoAnswer:
    if reply["code"] != 0:
        return MeltanoAnswer(error=f"exit {reply['code']}: {last_line(reply['stderr'])}", state_ids=[])
    return MeltanoAnswer(error=None, state_ids=list(reply["state_ids"]))


def last_line(text: str) -> str:
    """The message of an error: its last line that says error (Meltano's
    log lines end with a hint to its help pages), else the last line."""
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and "Need help fixing this problem" not in line]
    errors = [line for line in lines if re.search(r"\[error|error:|Error\b", line, re.IGNORECASE)]
    line = (errors or lines or ["(no message)"])[-1]
    # Meltano's log lines: `TIMESTAMP [error    ] meltano      MESSAGE`.
    line = re.sub(r"^\S+Z \[\w+\s*\]\s+\S+\s+", "", line)
    return line.replace("\t", "\\t")[:240]


def runlock_text(answer: Answer) -> str:
    if answer.code is None:
        return "timed out"
    if answer.code == 0:
        return f"keys {sorted(answer.stdout.split())}"
    return f"exit {answer.code}: {last_line(answer.stderr)}"


def run_verdict(refuse: Optional[str], meltano: MeltanoAnswer, runlock: Answer) -> Verdict:
    said = runlock_text(runlock)

    def verdict(passed: bool, category: str) -> Verdict:
        return Verdict(passed, category, meltano.text(), said)

    if runlock.code == 0:
        keys = runlock.stdout.split()
        if len(keys) != len(set(keys)):
            return verdict(False, "runlock prints a key twice")
        if meltano.error is not None:
            return verdict(False, "runlock keys where Meltano errors")
        if set(keys) == set(meltano.state_ids):
            return verdict(True, "same keys")
        if not meltano.state_ids:
            return verdict(False, "runlock keys where Meltano forms none")
        return verdict(False, "different keys")
    if runlock.code == REFUSED:
        if meltano.error is not None or not meltano.state_ids:
            return verdict(True, "both refuse")
        if refuse is None:
            return verdict(False, "runlock refuses a shape Meltano runs")
        if refuse not in runlock.stderr:
            return verdict(False, f"runlock refuses without naming {refuse}")
        return verdict(True, "declared refusal")
    return verdict(False, "runlock crashed or timed out" if runlock.code is None or runlock.code < 0
                   else f"runlock exit {runlock.code}")


# --- state_backend ---------------------------------------------------------
STORES = {"MELTANO_YML": "meltano.yml", "DOTENV": ".env", "ENV": "the environment"}
HEADER = re.compile(
    r"^#\s+(state_backend\.[\w.]+): (meltano\.yml's env:|meltano\.yml|\.env|the environment)(?: \((\w+)\))?\s*$"
)
#: runlockd names meltano.yml's top-level `env:` apart, to say where to look;
#: Meltano's settings count it as the environment (its ENV store).
SAME_STORE = {"meltano.yml's env:": "the environment"}


def header(stdout: str) -> Dict[str, Tuple[str, Optional[str]]]:
    """runlockd's `#   state_backend.NAME: SOURCE (VARIABLE)` lines."""
    found = {}
    for line in stdout.splitlines():
        match = HEADER.match(line)
        if match:
            found[match[1]] = (SAME_STORE.get(match[2], match[2]), match[3])
    return found


def expected_backend(uri: str) -> str:
    """The URI as the agent's TOML carries it: the store the Meltano add-on's
    `runlock+SCHEME://` wraps, no S3 keys, no database password."""
    uri = uri.removeprefix("runlock+")
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    userinfo, host = parts.netloc.rsplit("@", 1)
    if parts.scheme == "s3":
        return uri.replace(f"{userinfo}@", "", 1)
    if parts.scheme in ("postgresql", "postgres"):
        return uri.replace(f"{userinfo}@", f"{userinfo.split(':', 1)[0]}@", 1)
    return uri


# Settings whose values may be shown (the URI without its keys or password).
NOT_SECRET = {"state_backend.uri", "state_backend.s3.endpoint_url", "state_backend.azure.storage_account_url"}


def shown(name: str, value: Any) -> str:
    if name not in NOT_SECRET or not isinstance(value, str):
        return ""
    return f" = {redacted(value)}"


def redacted(uri: str) -> str:
    """`uri` without the user information, where keys and passwords are."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return uri.replace(parts.netloc.rsplit("@", 1)[0] + "@", "***@", 1)


def backend_verdict(settings: Optional[Dict[str, List[Any]]], meltano_error: Optional[str], secrets: List[str],
                    runlockd: Answer) -> Verdict:
    if settings is None:
        return Verdict(False, "Meltano could not read the settings", meltano_error or "", runlock_text(runlockd))
    found = {name: (STORES[store], variable, value) for name, (value, store, variable) in settings.items()
             if store in STORES}
    meltano_said = "; ".join(f"{name}: {source}{f' ({var})' if source != 'meltano.yml' else ''}{shown(name, value)}"
                             for name, (source, var, value) in sorted(found.items())) or "nothing"
    said = runlock_text(runlockd) if runlockd.code != 0 else "; ".join(
        f"{name}: {source}{f' ({var})' if var else ''}" for name, (source, var) in sorted(header(runlockd.stdout).items())
    ) or "lists no setting"

    def verdict(passed: bool, category: str) -> Verdict:
        return Verdict(passed, category, meltano_said, said)

    output = runlockd.stdout + runlockd.stderr
    if any(secret in output for secret in secrets):
        return verdict(False, "runlockd shows a secret")
    uri = found.get("state_backend.uri")
    # Found but empty (an empty variable, or one a missing variable emptied)
    # is no URI either.
    if uri is None or not uri[2] or expected_backend(uri[2]).startswith("systemdb"):
        return verdict(runlockd.code == NO_CONFIG, "no usable URI: runlockd refuses"
                       if runlockd.code == NO_CONFIG else "runlockd accepts a project with no usable URI")
    if runlockd.code != 0:
        return verdict(False, f"runlockd exit {runlockd.code}")
    listed = header(runlockd.stdout)
    for name in sorted(set(found) | set(listed)):
        if name not in found:
            return verdict(False, f"runlockd lists {name}, Meltano finds it nowhere")
        source, variable, _ = found[name]
        if name not in listed:
            return verdict(False, f"runlockd misses {name} ({source})")
        if listed[name][0] != source:
            return verdict(False, f"{name}: a different source")
        if source != "meltano.yml" and listed[name][1] != variable:
            return verdict(False, f"{name}: a different variable")
    try:
        toml = tomllib.loads(runlockd.stdout)
    except tomllib.TOMLDecodeError as err:
        return verdict(False, f"runlockd's output is not TOML: {err}")
    values = {
        "state_backend.uri": toml.get("backend"),
        "state_backend.s3.endpoint_url": toml.get("s3", {}).get("endpoint_url"),
        "state_backend.azure.storage_account_url": toml.get("azure", {}).get("account_url"),
    }
    for name, value in values.items():
        if name not in found:
            continue
        want = found[name][2]
        if name == "state_backend.uri":
            want = expected_backend(want)
        if value != want:
            return verdict(False, f"{name}: TOML has {value!r}, Meltano reads {want!r}")
    return verdict(True, "same settings")
