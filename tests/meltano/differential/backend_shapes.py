"""Projects whose ``state_backend`` settings ``runlockd check-config
--from-meltano`` reads: each setting placed in meltano.yml (nested or as a
dotted key), in .env (python-dotenv's syntaxes), in the process environment,
in meltano.yml's top-level ``env:``, or in several at once, for each kind of
store. Which source wins is never written here: the oracle asks Meltano's
``ProjectSettingsService``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from project_files import to_yaml
from shapes import PROJECT_ID

# The settings runlockd has a counterpart for (agent/src/meltano/state_backend.rs).
NAMES = [
    "state_backend.uri",
    "state_backend.s3.aws_access_key_id",
    "state_backend.s3.aws_secret_access_key",
    "state_backend.s3.endpoint_url",
    "state_backend.azure.connection_string",
    "state_backend.azure.storage_account_url",
    "state_backend.gcs.application_credentials",
    "state_backend.gcs.application_credentials_path",
    "state_backend.gcs.application_credentials_json",
]
# Values that must never appear in runlockd's output.
SECRETS = ["AKIDSECRET0001", "s3cr3tK3yV4lue", "AccountKey=c2VjcmV0a2V5", "pgp4ssw0rd", "gcs-json-secret"]


@dataclass
class BackendShape:
    id: str
    summary: str
    files: Dict[str, str]
    env: Dict[str, str]
    secrets: List[str] = field(default_factory=lambda: list(SECRETS))


def variable(name: str) -> str:
    return "MELTANO_" + name.replace(".", "_").upper()


@dataclass
class Placement:
    """Where a shape puts one setting."""

    yml: Dict[str, Any] = field(default_factory=dict)
    dotenv: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    yml_env: Dict[str, str] = field(default_factory=dict)


def put(placement: Placement, where: str, name: str, value: str) -> None:
    short = name[len("state_backend."):]
    block = placement.yml.setdefault("state_backend", {})
    if where == "yml":
        node = block
        parts = short.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    elif where == "yml-dotted":
        block[short] = value
    elif where == "yml-top-dotted":
        placement.yml[name] = value
    elif where == "dotenv":
        placement.dotenv.append(f"{variable(name)}={value}")
    elif where == "dotenv-export-quoted":
        placement.dotenv.append(f"export {variable(name)}='{value}'")
    elif where == "dotenv-spaces-double":
        placement.dotenv.append(f'{variable(name)} = "{value}"')
    elif where == "env":
        placement.env[variable(name)] = value
    elif where == "env-empty":
        placement.env[variable(name)] = ""
    elif where == "yml-env":
        placement.yml_env[variable(name)] = value
    else:
        raise ValueError(where)
    if not placement.yml.get("state_backend"):
        placement.yml.pop("state_backend", None)


def build(shape_id: str, settings: List[tuple[str, str, str]], extra_dotenv: Optional[List[str]] = None,
          extra_env: Optional[Dict[str, str]] = None) -> BackendShape:
    placement = Placement()
    for where, name, value in settings:
        put(placement, where, name, value)
    model: Dict[str, Any] = {"version": 1, "project_id": PROJECT_ID, "default_environment": "dev",
                             "environments": [{"name": "dev"}]}
    if placement.yml_env:
        model["env"] = placement.yml_env
    model.update(placement.yml)
    files = {"proj/meltano.yml": to_yaml(model)}
    dotenv = placement.dotenv + (extra_dotenv or [])
    if dotenv:
        files["proj/.env"] = "\n".join(dotenv) + "\n"
    summary = ", ".join(f"{name[len('state_backend.'):]} in {where}" for where, name, _ in settings)
    return BackendShape(shape_id, summary or "nothing", files, {**placement.env, **(extra_env or {})})


URI = "state_backend.uri"
ENDPOINT = "state_backend.s3.endpoint_url"
KEY_ID = "state_backend.s3.aws_access_key_id"
SECRET_KEY = "state_backend.s3.aws_secret_access_key"
CONNECTION = "state_backend.azure.connection_string"
ACCOUNT_URL = "state_backend.azure.storage_account_url"
GCS_PATH = "state_backend.gcs.application_credentials_path"
GCS_FILE = "state_backend.gcs.application_credentials"
GCS_JSON = "state_backend.gcs.application_credentials_json"

S3 = "s3://runlock-bucket/state"
WHERE = ["yml", "yml-dotted", "dotenv", "dotenv-export-quoted", "dotenv-spaces-double", "env", "yml-env"]


def backend_shapes() -> List[BackendShape]:
    shapes: List[BackendShape] = []
    # The URI alone, in each place.
    for where in WHERE + ["yml-top-dotted"]:
        shapes.append(build(f"uri-{where}", [(where, URI, S3)]))
    # Two places at once: which one Meltano reads.
    for first, second in [("yml", "env"), ("yml", "dotenv"), ("dotenv", "env"), ("yml-env", "dotenv"),
                          ("yml-env", "env"), ("yml", "env-empty"), ("yml-dotted", "yml")]:
        shapes.append(build(f"uri-{first}-and-{second}",
                            [(first, URI, "s3://first-bucket/state"), (second, URI, "s3://second-bucket/state")]))
    # The endpoint in each place, beside a URI in meltano.yml.
    for where in WHERE:
        shapes.append(build(f"s3-endpoint-{where}", [("yml", URI, S3), (where, ENDPOINT, "http://127.0.0.1:9000")]))
    shapes += [
        build("s3-keys-dotenv", [("yml", URI, S3), ("dotenv", KEY_ID, SECRETS[0]), ("dotenv", SECRET_KEY, SECRETS[1])]),
        build("s3-keys-env-and-yml", [("env", URI, S3), ("yml", KEY_ID, SECRETS[0]), ("env", SECRET_KEY, SECRETS[1])]),
        build("s3-keys-in-uri", [("yml", URI, f"s3://{SECRETS[0]}:{SECRETS[1]}@runlock-bucket/state")]),
        build("s3-uri-variable-dotenv", [("yml", URI, "s3://${BUCKET}/state")], extra_dotenv=["BUCKET=from-dotenv"]),
        build("s3-uri-variable-env", [("yml", URI, "s3://${BUCKET}/state")], extra_env={"BUCKET": "from-env"}),
        build("s3-endpoint-variable", [("yml", URI, S3), ("yml", ENDPOINT, "http://${HOST}:9000")],
              extra_env={"HOST": "minio.internal"}),
        build("azure-url-yml-connection-env", [("yml", URI, "azure://state-container"),
                                               ("yml", ACCOUNT_URL, "https://acct.blob.core.windows.net"),
                                               ("env", CONNECTION, f"DefaultEndpointsProtocol=https;{SECRETS[2]}")]),
        build("azure-connection-dotenv", [("dotenv", URI, "azure://state-container"),
                                          ("dotenv-export-quoted", CONNECTION, f"{SECRETS[2]};EndpointSuffix=x")]),
        build("gcs-path-dotenv", [("yml", URI, "gs://state-bucket/prefix"), ("dotenv", GCS_PATH, "keys/sa.json")]),
        build("gcs-file-env", [("env", URI, "gs://state-bucket"), ("env", GCS_FILE, "/etc/sa.json")]),
        build("gcs-json-env", [("yml", URI, "gs://state-bucket"), ("env", GCS_JSON, '{"k": "gcs-json-secret"}')]),
        build("postgres-password-dotenv", [("dotenv", URI, f"postgresql://runlock:{SECRETS[3]}@db.internal:5432/state")]),
        build("postgres-yml", [("yml", URI, "postgresql://runlock@db.internal/state")]),
        build("file-yml", [("yml", URI, "file:///var/lib/meltano-state")]),
        build("systemdb-yml", [("yml", URI, "systemdb")]),
        build("add-on-s3-dotenv", [("dotenv", URI, "runlock+s3://runlock-bucket/state"),
                                   ("yml", ENDPOINT, "http://127.0.0.1:9000")]),
        build("add-on-gcs-yml", [("yml", URI, "runlock+gs://state-bucket/prefix"), ("env", GCS_PATH, "/etc/sa.json")]),
        build("add-on-systemdb", [("yml", URI, "runlock+systemdb://")]),
        build("nothing", []),
        build("only-endpoint", [("dotenv", ENDPOINT, "http://127.0.0.1:9000")]),
        build("uri-variable-unset", [("yml", URI, "${NO_SUCH_BUCKET_URI}")]),
        included_env_shape(),
    ]
    return shapes


def included_env_shape() -> BackendShape:
    """The URI's variable in an included file's top-level env: (merged into meltano.yml's)."""
    shape = build("uri-included-yml-env", [("yml", ENDPOINT, "http://127.0.0.1:9000")])
    shape.files["proj/meltano.yml"] += "include_paths:\n- extra/env.meltano.yml\n"
    shape.files["proj/extra/env.meltano.yml"] = to_yaml({"env": {variable(URI): S3}})
    shape.summary = "uri in an included file's env:, s3.endpoint_url in yml"
    return shape
