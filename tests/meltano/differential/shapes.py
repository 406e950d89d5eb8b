"""The Meltano project shapes: a seeded combination of every input Meltano
reads to form the state IDs of a ``meltano run`` (or ``el``/``elt``).

A shape starts from one project (three environments, extractors and
loaders with ``inherit_from``, a mapper with two mappings, two utilities,
three jobs) and a plain ``meltano run tap-a target-a``; each dimension below
then changes one thing, in a fixed order (where the project is comes last:
it moves files that the others wrote). The variants are written by hand;
which Meltano answer each gets is never written here: the oracle asks
Meltano. A variant marked ``alone`` (an error, a refusal, an oddity) is
tried once, with every other dimension plain; the others are also combined
at random (seeded, so the ids and shapes are the same on every run).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from project_files import to_yaml

PROJECT_ID = "5a1b2c3d-0000-4000-8000-000000000000"
SEED = 44
# Shapes combining several non-plain variants, on top of each variant once.
COMBINED = 70
RUN_ID = "0e7c4a52-3b7e-4a6c-9f11-2f5d8a1b9c00"


@dataclass
class Shape:
    """One project and command, and what runlock is allowed to refuse."""

    id: str
    summary: str
    files: Dict[str, str]
    # Where both run, under the shape's directory.
    cwd: str
    env: Dict[str, str]
    # After `meltano`, as runlock sees them.
    args: List[str]
    # What runlock sees before them: `meltano`, perhaps behind a wrapper.
    launcher: List[str]
    # As Meltano is asked: a dry run, and without what does not change the keys.
    oracle_args: List[str]
    oracle_env: Dict[str, str]
    # An input runlock must name if it refuses a shape Meltano runs.
    refuse: Optional[str] = None
    why: str = ""


@dataclass
class Draft:
    """A shape being built: the project as a model, the rest as given."""

    yml: Dict[str, Any]
    included: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # The project's .env, line by line; None for no file.
    dotenv: Optional[List[str]] = None
    dotenv_newline: str = "\n"
    env: Dict[str, str] = field(default_factory=dict)
    global_opts: List[str] = field(default_factory=list)
    # How runlock's command line starts the `meltano` the oracle runs.
    launcher: List[str] = field(default_factory=lambda: ["meltano"])
    command: str = "run"
    command_opts: List[str] = field(default_factory=list)
    blocks: List[str] = field(default_factory=lambda: ["tap-a", "target-a"])
    trailing_opts: List[str] = field(default_factory=list)
    cwd: str = "proj"
    # The project directory under the shape's directory.
    root: str = "proj"
    other_files: Dict[str, str] = field(default_factory=dict)
    # Arguments and variables Meltano is run without (they change no key).
    oracle_drops_args: List[str] = field(default_factory=list)
    oracle_drops_env: List[str] = field(default_factory=list)
    refuse: Optional[str] = None
    why: str = ""

    def dotenv_add(self, *lines: str) -> None:
        self.dotenv = (self.dotenv or []) + list(lines)

    def environment(self, name: str) -> Dict[str, Any]:
        for env in self.yml.get("environments", []):
            if env["name"] == name:
                result: Dict[str, Any] = env
                return result
        raise KeyError(name)

    def suffix(self, value: str) -> None:
        """The `state_id_suffix` of both environments a shape usually selects."""
        for name in ("dev", "prod"):
            self.environment(name)["state_id_suffix"] = value

    def plugin(self, kind: str, name: str) -> Dict[str, Any]:
        for plugin in self.yml["plugins"][kind]:
            if plugin["name"] == name:
                result: Dict[str, Any] = plugin
                return result
        raise KeyError(name)


def plugin(name: str, **extra: Any) -> Dict[str, Any]:
    """A plugin Meltano needs not install: no pip_url, an executable that exists."""
    return {"name": name, "namespace": name.replace("-", "_"), "executable": "/bin/true", **extra}


def base_project() -> Dict[str, Any]:
    return {
        "version": 1,
        "project_id": PROJECT_ID,
        "default_environment": "dev",
        "environments": [{"name": "dev"}, {"name": "prod"}, {"name": "staging"}],
        "plugins": {
            "extractors": [plugin("tap-a"), {"name": "tap-b", "inherit_from": "tap-a"}],
            "loaders": [plugin("target-a"), {"name": "target-b", "inherit_from": "target-a"}],
            "mappers": [
                plugin("mapper-x", mappings=[{"name": "m1", "config": {}}, {"name": "m2", "config": {}}]),
            ],
            "utilities": [plugin("dbt-x", commands={"run": "run"}), plugin("util-y")],
        },
        "jobs": [
            {"name": "job-one", "tasks": ["tap-a target-a"]},
            # A bare string: Meltano takes it as a list of one-letter blocks.
            {"name": "job-str", "tasks": "tap-a target-a"},
            {"name": "job-list", "tasks": ["tap-b m1 target-a", "dbt-x:run"]},
            {"name": "job-lol", "tasks": [["tap-a", "target-b"], ["tap-b", "target-a"]]},
        ],
    }


Apply = Callable[[Draft], None]


@dataclass
class Variant:
    tag: str
    apply: Apply
    # Tried once with everything else plain, never combined at random.
    alone: bool = False


def v(tag: str, *steps: Apply, alone: bool = False) -> Variant:
    def apply(draft: Draft) -> None:
        for step in steps:
            step(draft)

    return Variant(tag, apply, alone)


# Small steps the variants are made of.
def glob(*opts: str) -> Apply:
    return lambda d: d.global_opts.extend(opts)


def opts(*args: str) -> Apply:
    return lambda d: d.command_opts.extend(args)


def trailing(*args: str) -> Apply:
    return lambda d: d.trailing_opts.extend(args)


def env(**variables: str) -> Apply:
    return lambda d: d.env.update(variables)


def launcher(*words: str) -> Apply:
    return lambda d: setattr(d, "launcher", list(words))


def dotenv(*lines: str) -> Apply:
    return lambda d: d.dotenv_add(*lines)


def yml(key: str, value: Any) -> Apply:
    return lambda d: d.yml.__setitem__(key, value)


def no_default(d: Draft) -> None:
    d.yml.pop("default_environment", None)


def suffix(value: str) -> Apply:
    return lambda d: d.suffix(value)


def blocks(*names: str) -> Apply:
    def set_blocks(d: Draft) -> None:
        d.blocks = list(names)

    return set_blocks


def refuse(name: str, why: str) -> Apply:
    def declare(d: Draft) -> None:
        d.refuse, d.why = name, why

    return declare


def oracle_drops(*args: str, env: Tuple[str, ...] = ()) -> Apply:
    def drop(d: Draft) -> None:
        d.oracle_drops_args.extend(args)
        d.oracle_drops_env.extend(env)

    return drop


# --- The environment Meltano selects ---------------------------------------
ENVIRONMENT = [
    v("default"),
    v("flag", glob("--environment", "prod")),
    v("flag=", glob("--environment=prod")),
    v("flag-staging", glob("--environment", "staging")),
    v("no-environment", glob("--no-environment")),
    v("no_environment", glob("--no_environment"), alone=True),
    v("flag-empty", glob("--environment="), env(MELTANO_ENVIRONMENT="prod"), alone=True),
    v("flag-null", glob("--environment", "null"), alone=True),
    v("flag-NULL", glob("--environment=NULL"), alone=True),
    v("flag-missing", glob("--environment", "nope"), alone=True),
    v("flag-after-run", opts("--environment", "prod"), alone=True),
    v("flag-over-process", glob("--environment", "staging"), env(MELTANO_ENVIRONMENT="prod")),
    v("flag-twice", glob("--environment", "staging", "--environment=prod")),
    v("env-launcher", launcher("env", "MELTANO_ENVIRONMENT=prod", "meltano")),
    v("path-launcher", launcher("/opt/meltano/bin/meltano"), glob("--environment", "prod")),
    v("process", env(MELTANO_ENVIRONMENT="prod")),
    v("process-empty", env(MELTANO_ENVIRONMENT="")),
    v("process-empty-over-dotenv", env(MELTANO_ENVIRONMENT=""), dotenv("MELTANO_ENVIRONMENT=prod"), alone=True),
    v("process-null", env(MELTANO_ENVIRONMENT="null"), alone=True),
    v("process-missing", env(MELTANO_ENVIRONMENT="nope"), alone=True),
    v("process-spaces", env(MELTANO_ENVIRONMENT=" prod"), alone=True),
    v("flag-case", glob("--environment", "PROD"), alone=True),
    v("name-with-colon", lambda d: d.yml["environments"].append({"name": "a:b"}), glob("--environment", "a:b"),
      alone=True),
    v("process-over-dotenv", env(MELTANO_ENVIRONMENT="prod"), dotenv("MELTANO_ENVIRONMENT=staging")),
    v("dotenv", dotenv("MELTANO_ENVIRONMENT=prod")),
    v("dotenv-single", dotenv("MELTANO_ENVIRONMENT='prod'")),
    v("dotenv-double", dotenv('MELTANO_ENVIRONMENT="prod"')),
    v("dotenv-export", dotenv("export MELTANO_ENVIRONMENT=prod")),
    v("dotenv-spaces", dotenv("MELTANO_ENVIRONMENT = prod")),
    v("dotenv-quoted-name", dotenv("'MELTANO_ENVIRONMENT'=prod"), alone=True),
    v("dotenv-comment", dotenv("# MELTANO_ENVIRONMENT=staging", "MELTANO_ENVIRONMENT=prod # the one")),
    v("dotenv-hash-no-space", dotenv("MELTANO_ENVIRONMENT=prod#x"), alone=True),
    v("dotenv-last-wins", dotenv("MELTANO_ENVIRONMENT=staging", "MELTANO_ENVIRONMENT=prod")),
    v("dotenv-crlf", dotenv("MELTANO_ENVIRONMENT=prod", "OTHER=1"), lambda d: setattr(d, "dotenv_newline", "\r\n")),
    v("dotenv-interp-earlier", dotenv("STAGE=pr", "MELTANO_ENVIRONMENT=${STAGE}od")),
    v("dotenv-interp-double", dotenv("STAGE=pr", 'MELTANO_ENVIRONMENT="${STAGE}od"')),
    v("dotenv-interp-process", env(STAGE="prod"), dotenv("MELTANO_ENVIRONMENT=${STAGE}")),
    v("dotenv-interp-both", env(STAGE="staging"), dotenv("STAGE=prod", "MELTANO_ENVIRONMENT=${STAGE}"), alone=True),
    v("dotenv-interp-later", dotenv("MELTANO_ENVIRONMENT=${STAGE}", "STAGE=prod"), alone=True),
    v("dotenv-interp-default", dotenv("MELTANO_ENVIRONMENT=${UNSET_STAGE:-prod}")),
    v("dotenv-interp-default-empty", env(STAGE=""), dotenv("MELTANO_ENVIRONMENT=${STAGE:-prod}"), alone=True),
    v("dotenv-interp-yml-env", yml("env", {"STAGE": "prod"}), dotenv("MELTANO_ENVIRONMENT=${STAGE}"), alone=True),
    v("dotenv-trailing-spaces", dotenv("MELTANO_ENVIRONMENT=prod   ")),
    v("dotenv-junk-line", dotenv("this is not a line python-dotenv reads", "MELTANO_ENVIRONMENT=prod"), alone=True),
    v("dotenv-interp-single", dotenv("STAGE=prod", "MELTANO_ENVIRONMENT='${STAGE}'"), alone=True),
    v("dotenv-dollar-bare", env(STAGE="prod"), dotenv("MELTANO_ENVIRONMENT=$STAGE"), alone=True),
    v("dotenv-empty", dotenv("MELTANO_ENVIRONMENT=")),
    v("dotenv-no-value", dotenv("MELTANO_ENVIRONMENT"), alone=True),
    v("dotenv-null", dotenv("MELTANO_ENVIRONMENT=null"), alone=True),
    v("yml-env-ignored", yml("env", {"MELTANO_ENVIRONMENT": "prod"}), alone=True),
    v("default-prod", yml("default_environment", "prod")),
    v("default-none", no_default, alone=True),
    v("default-missing", yml("default_environment", "nope"), alone=True),
    v("default-process", env(MELTANO_DEFAULT_ENVIRONMENT="prod")),
    v("default-dotenv", dotenv("MELTANO_DEFAULT_ENVIRONMENT=prod")),
    v("default-yml-env", yml("env", {"MELTANO_DEFAULT_ENVIRONMENT": "prod"})),
    v("default-process-no-yml", no_default, env(MELTANO_DEFAULT_ENVIRONMENT="prod")),
    v("default-var-process", yml("default_environment", "${DEFENV}"), env(DEFENV="prod")),
    v("default-var-dotenv", yml("default_environment", "${DEFENV}"), dotenv("DEFENV=prod")),
    v("default-var-yml-env", yml("default_environment", "${DEFENV}"), yml("env", {"DEFENV": "prod"})),
    v("default-var-unset", yml("default_environment", "${DEFENV}"), alone=True),
    # Meltano expands default_environment with the project's settings only:
    # neither a plugin's env: nor the MELTANO_* setting variables take part.
    v("default-var-plugin-env", yml("default_environment", "${DEFENV}"),
      lambda d: d.plugin("extractors", "tap-a").__setitem__("env", {"DEFENV": "prod"}), alone=True),
    v("default-var-setting", yml("default_environment", "${MELTANO_CLI_LOG_LEVEL}"),
      lambda d: d.yml["environments"].append({"name": "info"}), alone=True),
]


# --- The suffix ------------------------------------------------------------
def env_env(values: Dict[str, str]) -> Apply:
    def put(d: Draft) -> None:
        for name in ("dev", "prod"):
            d.environment(name)["env"] = dict(values)

    return put


def plugin_env(kind: str, name: str, values: Dict[str, str]) -> Apply:
    return lambda d: d.plugin(kind, name).__setitem__("env", dict(values))


PLUGIN_ENV_WHY = (
    "the variable is set only in a plugin's env:, which Meltano's expansion of "
    "state_id_suffix sees only if that plugin's settings are the first it reads "
    "(the first block's, or its parent's)"
)
SETTING_WHY = (
    "the variable is a MELTANO_* setting or plugin variable that Meltano adds for "
    "the first plugin whose settings it reads; runlock cannot know its value"
)

EXPANSIONS_WHY = (
    "Meltano expands state_id_suffix again each time it reads a plugin's settings, "
    "so an escaped $ or a $ in a variable's value is expanded by a later reading: "
    "how many there are depends on the plugins"
)

SUFFIX = [
    v("none"),
    v("flag", opts("--state-id-suffix", "s1")),
    v("flag=", opts("--state-id-suffix=s1")),
    v("flag_underscore", opts("--state_id_suffix", "s1")),
    v("flag_underscore=", opts("--state_id_suffix=s_1")),
    v("flag-trailing", trailing("--state-id-suffix", "s1")),
    v("flag-empty", opts("--state-id-suffix", ""), suffix("blue")),
    v("flag-twice", opts("--state-id-suffix", "s1", "--state-id-suffix", "s2")),
    v("flag-colon", opts("--state-id-suffix", "a:b"), alone=True),
    v("process", env(MELTANO_RUN_STATE_ID_SUFFIX="s2")),
    v("process-empty", env(MELTANO_RUN_STATE_ID_SUFFIX=""), suffix("blue")),
    v("process-colon", env(MELTANO_RUN_STATE_ID_SUFFIX="a:b"), alone=True),
    v("flag-over-process", opts("--state-id-suffix", "s1"), env(MELTANO_RUN_STATE_ID_SUFFIX="s2")),
    v("dotenv-ignored", dotenv("MELTANO_RUN_STATE_ID_SUFFIX=s3"), alone=True),
    v("literal", suffix("blue")),
    v("literal-colon", suffix("a:b"), alone=True),
    v("flag-over-literal", opts("--state-id-suffix", "s1"), suffix("blue")),
    v("process-over-literal", env(MELTANO_RUN_STATE_ID_SUFFIX="s2"), suffix("blue")),
    v("var-process", suffix("$SUF"), env(SUF="green")),
    v("braced-process", suffix("${SUF}"), env(SUF="green")),
    v("braced-process-empty", suffix("${SUF}"), env(SUF="")),
    v("braced-process-colon", suffix("${SUF}"), env(SUF="x:y"), alone=True),
    v("braced-dotenv", suffix("${SUF}"), dotenv("SUF=green")),
    v("braced-dotenv-quoted", suffix("${SUF}"), dotenv("export SUF='green'")),
    v("var-dotenv-interp", suffix("$SUF"), dotenv("COLOUR=gre", "SUF=${COLOUR}en")),
    v("braced-unset", suffix("${SUF}")),
    v("braced-yml-env", suffix("${SUF}"), yml("env", {"SUF": "green"})),
    v("yml-env-over-process", suffix("${SUF}"), yml("env", {"SUF": "green"}), env(SUF="red"), alone=True),
    v("process-over-dotenv", suffix("${SUF}"), env(SUF="green"), dotenv("SUF=red"), alone=True),
    v("environment-env-only", suffix("${SUF}"), env_env({"SUF": "green"}), alone=True),
    v("environment-env-only-inherited", suffix("${SUF}"), env_env({"SUF": "green"}), blocks("tap-b", "target-a"),
      alone=True),
    v("lowercase-bare", suffix("$suf"), env(suf="green"), alone=True),
    v("lowercase-braced", suffix("${suf}"), env(suf="green")),
    v("escaped", suffix("\\$SUF"), env(SUF="green"), refuse("SUF", EXPANSIONS_WHY), alone=True),
    v("escaped-twice", suffix("\\\\$SUF"), env(SUF="green"), refuse("SUF", EXPANSIONS_WHY), alone=True),
    v("escaped-twice-more-plugins", suffix("\\\\$SUF"), env(SUF="green"), blocks("tap-b", "m1", "target-b"),
      refuse("SUF", EXPANSIONS_WHY), alone=True),
    v("value-with-dollar", suffix("${SUF}"), dotenv("SUF=$OTHER"), env(OTHER="deep"), refuse("SUF", EXPANSIONS_WHY),
      alone=True),
    v("yml-env-run-suffix-ignored", yml("env", {"MELTANO_RUN_STATE_ID_SUFFIX": "s4"}), alone=True),
    v("composite", suffix("x-${SUF}-$OTHER"), env(SUF="a"), dotenv("OTHER=b")),
    v("environment-name", suffix("${MELTANO_ENVIRONMENT}-s"), alone=True),
    v("plugin-env-extractor", suffix("${PLUGSUF}"), plugin_env("extractors", "tap-a", {"PLUGSUF": "x"}),
      refuse("PLUGSUF", PLUGIN_ENV_WHY), alone=True),
    v("plugin-env-loader", suffix("${PLUGSUF}"), plugin_env("loaders", "target-a", {"PLUGSUF": "x"}),
      refuse("PLUGSUF", PLUGIN_ENV_WHY), alone=True),
    v("plugin-env-over-process", suffix("${SUF}"), env(SUF="green"),
      plugin_env("extractors", "tap-a", {"SUF": "x"}), refuse("SUF", PLUGIN_ENV_WHY), alone=True),
    v("plugin-variable", suffix("${MELTANO_EXTRACTOR_NAME}"),
      refuse("MELTANO_EXTRACTOR_NAME", SETTING_WHY), alone=True),
    v("setting-variable", suffix("${MELTANO_CLI_LOG_LEVEL}"),
      refuse("MELTANO_CLI_LOG_LEVEL", SETTING_WHY), alone=True),
]


# --- The blocks of `meltano run` -------------------------------------------
BLOCKS = [
    v("plain"),
    v("inherited-extractor", blocks("tap-b", "target-a")),
    v("inherited-loader", blocks("tap-a", "target-b")),
    v("mapping", blocks("tap-b", "m1", "target-a")),
    v("two-mappings", blocks("tap-a", "m1", "m2", "target-b")),
    v("mapper-name", blocks("tap-a", "mapper-x", "target-a"), alone=True),
    v("command-after", blocks("tap-a", "target-a", "dbt-x:run")),
    v("command-before", blocks("dbt-x:run", "tap-b", "target-b")),
    v("utility-only", blocks("util-y"), alone=True),
    v("commands-only", blocks("dbt-x:run", "util-y"), alone=True),
    v("two-pipelines", blocks("tap-a", "target-a", "tap-b", "target-b")),
    v("same-twice", blocks("tap-a", "target-a", "tap-a", "target-a")),
    v("job-one-task", blocks("job-one")),
    v("job-string", blocks("job-str"), alone=True),
    v("job-double-space", lambda d: d.yml["jobs"].append({"name": "job-sp", "tasks": ["tap-a  target-a"]}),
      blocks("job-sp"), alone=True),
    v("job-tab", lambda d: d.yml["jobs"].append({"name": "job-tab", "tasks": ["tap-a\ttarget-a"]}),
      blocks("job-tab"), alone=True),
    v("job-list", blocks("job-list")),
    v("job-list-of-lists", blocks("job-lol")),
    v("job-and-plugins", blocks("job-one", "dbt-x:run", "tap-b", "m2", "target-b")),
    v("unknown-block", blocks("tap-zzz", "target-a"), alone=True),
    v("unknown-command", blocks("tap-a", "target-a", "dbt-x:nope"), alone=True),
    v("extractor-alone", blocks("tap-a"), alone=True),
    v("extractor-then-utility", blocks("tap-a", "util-y", "target-a"), alone=True),
    v("loader-alone", blocks("target-a"), alone=True),
    v("double-dash", blocks("--", "tap-a", "target-a"), alone=True),
    v("extractor-with-command", blocks("tap-a:run", "target-a"), alone=True),
    v("job-in-job", lambda d: d.yml["jobs"].append({"name": "job-nest", "tasks": ["job-one"]}),
      blocks("job-nest"), alone=True),
    v("job-ambiguous", lambda d: d.yml["jobs"].append({"name": "tap-b", "tasks": ["tap-b target-a"]}),
      blocks("tap-b"), alone=True),
    v("mapping-in-two-mappers", lambda d: d.yml["plugins"]["mappers"].append(
        plugin("mapper-z", mappings=[{"name": "m1", "config": {}}])), blocks("tap-a", "m1", "target-a"), alone=True),
    v("name-in-two-kinds", lambda d: d.yml["plugins"]["utilities"].append(plugin("tap-a")), alone=True),
    v("job-shadows-plugin", lambda d: d.yml["jobs"].append({"name": "tap-b", "tasks": ["tap-a target-b"]}),
      blocks("tap-b"), alone=True),
]


# --- Where the project is --------------------------------------------------
def cwd(path: str) -> Apply:
    return lambda d: setattr(d, "cwd", path)


def env_file(name: str) -> Apply:
    """The .env's lines go to `name` under the project; a decoy .env stays."""

    def move(d: Draft) -> None:
        lines = d.dotenv or []
        d.other_files[f"{d.root}/{name}"] = d.dotenv_newline.join(lines) + d.dotenv_newline
        d.dotenv = ["MELTANO_ENVIRONMENT=staging", "SUF=decoy", "STAGE=staging"]

    return move


def sub_dotenv(d: Draft) -> None:
    d.other_files[f"{d.root}/sub/.env"] = "MELTANO_ENVIRONMENT=staging\nSUF=decoy\n"


LOCATION = [
    v("root"),
    v("subdir", cwd("proj/sub/deeper")),
    v("subdir-own-dotenv", cwd("proj/sub"), sub_dotenv),
    v("cwd-flag", cwd("."), glob("--cwd", "proj")),
    v("cwd-flag=abs", cwd("."), glob("--cwd={dir}/proj")),
    v("cwd-flag-missing", cwd("."), glob("--cwd", "nowhere"), alone=True),
    v("project-root-abs", cwd("."), env(MELTANO_PROJECT_ROOT="{dir}/proj")),
    v("project-root-rel", cwd("."), env(MELTANO_PROJECT_ROOT="proj")),
    v("project-root-rel-from-cwd-flag", cwd("."), glob("--cwd", "proj/sub"), env(MELTANO_PROJECT_ROOT=".."),
      alone=True),
    v("project-root-empty-walks", cwd("proj/sub"), env(MELTANO_PROJECT_ROOT=""), alone=True),
    v("no-project", cwd("."), alone=True),
    v("project-root-without-project", cwd("proj"), env(MELTANO_PROJECT_ROOT="{dir}/proj/sub"), alone=True),
    v("env-file", env_file("custom.env"), glob("--env-file", "custom.env")),
    v("env-file=", env_file("custom.env"), glob("--env-file=custom.env")),
    v("env_file", env_file("custom.env"), glob("--env_file", "custom.env")),
    v("env-file-from-subdir", env_file("conf/custom.env"), cwd("proj/sub"), glob("--env-file", "conf/custom.env")),
    v("env-file-abs", env_file("custom.env"), glob("--env-file", "{dir}/proj/custom.env")),
    v("env-file-missing", glob("--env-file", "missing.env"), alone=True),
    v("env-file-missing-dotenv-unread", dotenv("MELTANO_ENVIRONMENT=prod"), glob("--env-file", "missing.env"),
      alone=True),
    v("cwd-flag-and-env-file", dotenv("MELTANO_ENVIRONMENT=prod"), env_file("custom.env"), cwd("."),
      glob("--cwd", "proj/sub", "--env-file", "custom.env"), alone=True),
]


# --- include_paths ----------------------------------------------------------
def include(path: str, *keys: str) -> Apply:
    """Moves the top-level `keys` (or `plugins.KIND`) of meltano.yml to `path`."""

    def move(d: Draft) -> None:
        part: Dict[str, Any] = d.included.setdefault(path, {})
        for key in keys:
            if key.startswith("plugins."):
                kind = key.split(".", 1)[1]
                part.setdefault("plugins", {})[kind] = d.yml["plugins"].pop(kind)
            else:
                part[key] = d.yml.pop(key)

    return move


def include_paths(*patterns: str) -> Apply:
    return yml("include_paths", list(patterns))


def included_extra(path: str, key: str, value: Any) -> Apply:
    return lambda d: d.included.setdefault(path, {}).__setitem__(key, value)


INCLUDES = [
    v("none"),
    v("loaders", include("extra/loaders.meltano.yml", "plugins.loaders"),
      include_paths("./extra/loaders.meltano.yml")),
    v("environments", include("extra/envs.meltano.yml", "environments"), include_paths("extra/envs.meltano.yml")),
    v("jobs-and-mappers", include("extra/jobs.meltano.yml", "jobs"),
      include("extra/mappers.meltano.yml", "plugins.mappers"), include_paths("./extra/*.meltano.yml")),
    v("everything", include("sub/a.yml", "plugins.extractors", "plugins.utilities"),
      include("sub/b.yml", "environments", "jobs"), include_paths("sub/a.yml", "sub/b.yml")),
    v("environment-twice", lambda d: d.environment("prod").__setitem__("state_id_suffix", "main"),
      lambda d: d.environment("dev").__setitem__("state_id_suffix", "main"),
      included_extra("extra/more.meltano.yml", "environments",
                     [{"name": "prod", "state_id_suffix": "incl"}, {"name": "dev", "state_id_suffix": "incl"}]),
      include_paths("extra/more.meltano.yml"), alone=True),
    v("default-environment-included", included_extra("extra/more.meltano.yml", "default_environment", "prod"),
      include_paths("extra/more.meltano.yml"), alone=True),
    v("env-included", suffix("${SUF}"), included_extra("extra/more.meltano.yml", "env", {"SUF": "green"}),
      include_paths("extra/more.meltano.yml"), alone=True),
    v("missing-file-pattern", include_paths("extra/none-*.yml")),
]


# --- Options of `meltano run` that do not change the keys ------------------
NO_STATE_UPDATE_NOTE = (
    "runlock locks the key the same command would have without it (same pipeline): "
    "Meltano is asked without it"
)

OPTIONS = [
    v("none"),
    v("full-refresh", opts("--full-refresh")),
    v("full_refresh", opts("--full_refresh")),
    v("no-install", opts("--no-install")),
    v("install", opts("--install")),
    v("merge-state", opts("--merge-state")),
    v("state-strategy", opts("--state-strategy", "merge")),
    v("state-strategy=", opts("--state-strategy=overwrite")),
    v("refresh-catalog", opts("--refresh-catalog")),
    v("force", opts("--force")),
    v("f", opts("-f")),
    v("force-variable", env(MELTANO_RUN_FORCE="true")),
    v("run-id", opts("--run-id", RUN_ID)),
    v("timeout", opts("--timeout=30")),
    v("dry-run", opts("--dry-run")),
    v("trailing", trailing("--full-refresh", "--no-install")),
    v("full-refresh-variable", env(MELTANO_RUN_FULL_REFRESH="1")),
    v("log-level", glob("--log-level", "debug")),
    v("log-level=", glob("--log-level=warning")),
    # --no-state-update: Meltano then forms no state ID at all, but the
    # pipeline is the one the command without it runs, so runlock locks that
    # key; Meltano is asked for the command without it.
    v("no-state-update", opts("--no-state-update"), oracle_drops("--no-state-update")),
    v("no-state-update-variable", env(MELTANO_RUN_NO_STATE_UPDATE="true"),
      oracle_drops(env=("MELTANO_RUN_NO_STATE_UPDATE",))),
    v("unknown-option", opts("--bogus"), alone=True),
]


# --- `meltano el` / `meltano elt` -------------------------------------------
EPHEMERAL_WHY = "no state ID: Meltano makes up an ephemeral, timestamped one"


def el(command: str, *args: str) -> Apply:
    def set_command(d: Draft) -> None:
        d.command = command
        d.blocks = list(args)

    return set_command


STATE_ID = [
    v("flag", opts("--state-id", "my-id")),
    v("flag=", opts("--state-id=my-id")),
    v("flag_underscore", opts("--state_id", "my-id")),
    v("flag-trailing", trailing("--state-id", "my-id")),
    v("flag-colon", opts("--state-id", "prod:tap-a-to-target-a:x")),
    v("process", env(MELTANO_STATE_ID="env-id")),
    v("flag-over-process", opts("--state-id", "my-id"), env(MELTANO_STATE_ID="env-id")),
    v("none", refuse("--state-id", EPHEMERAL_WHY)),
    v("flag-empty", opts("--state-id", ""), refuse("--state-id", EPHEMERAL_WHY)),
    v("dotenv-only", dotenv("MELTANO_STATE_ID=dotenv-id"), refuse("--state-id", EPHEMERAL_WHY)),
    v("yml-env-only", yml("env", {"MELTANO_STATE_ID": "yml-id"}), refuse("--state-id", EPHEMERAL_WHY)),
    v("process-empty", env(MELTANO_STATE_ID=""), refuse("--state-id", EPHEMERAL_WHY)),
    v("env-launcher", launcher("env", "MELTANO_STATE_ID=launcher-id", "meltano")),
]

EL_COMMANDS = [
    v("el", el("el", "tap-a", "target-a")),
    v("elt", el("elt", "tap-b", "target-b")),
    v("el-options", el("el", "tap-a", "target-b"), opts("--full-refresh", "--select", "x", "--no-install")),
    v("elt-transform-skip", el("elt", "tap-a", "target-a"), opts("--transform", "skip")),
    v("el-unknown-extractor", el("el", "tap-zzz", "target-a"), alone=True),
    v("el-utility", el("el", "util-y", "target-a"), alone=True),
]

# The environment dimension as el/elt take it: it decides errors only.
EL_ENVIRONMENT = [v("default"), v("no-environment", glob("--no-environment")),
                  v("flag-missing", glob("--environment", "nope"), alone=True),
                  v("dotenv", dotenv("MELTANO_ENVIRONMENT=prod"))]

RUN_DIMENSIONS: List[Tuple[str, List[Variant]]] = [
    ("env", ENVIRONMENT), ("suffix", SUFFIX), ("blocks", BLOCKS), ("include", INCLUDES),
    ("options", OPTIONS), ("location", LOCATION),
]
EL_DIMENSIONS: List[Tuple[str, List[Variant]]] = [
    ("command", EL_COMMANDS), ("state-id", STATE_ID), ("env", EL_ENVIRONMENT), ("location", LOCATION),
]


def build(shape_id: str, picks: List[Tuple[str, Variant]]) -> Shape:
    draft = Draft(yml=base_project())
    for _, variant in picks:
        variant.apply(draft)
    files = {f"{draft.root}/meltano.yml": to_yaml(draft.yml)}
    for path, part in draft.included.items():
        files[f"{draft.root}/{path}"] = to_yaml(part)
    if draft.dotenv is not None:
        files[f"{draft.root}/.env"] = draft.dotenv_newline.join(draft.dotenv) + draft.dotenv_newline
    files.update(draft.other_files)
    files.setdefault(f"{draft.root}/sub/deeper/.keep", "")
    args = [*draft.global_opts, draft.command, *draft.command_opts, *draft.blocks, *draft.trailing_opts]
    oracle_args = [a for a in args if a not in draft.oracle_drops_args]
    at = oracle_args.index(draft.command) + 1
    if draft.command == "run" and "--dry-run" not in oracle_args:
        oracle_args.insert(at, "--dry-run")
    elif draft.command in ("el", "elt"):
        oracle_args.insert(at, "--dry")
    oracle_env = {k: val for k, val in draft.env.items() if k not in draft.oracle_drops_env}
    # An `env NAME=VALUE meltano` launcher's variables are Meltano's too.
    if draft.launcher[:1] == ["env"]:
        for assignment in draft.launcher[1:-1]:
            name, value = assignment.split("=", 1)
            oracle_env[name] = value
    summary = " ".join(f"{dim}={variant.tag}" for dim, variant in picks if not plain(variant))
    return Shape(
        id=shape_id,
        summary=summary or "plain",
        files=files,
        cwd=draft.cwd,
        env=draft.env,
        args=args,
        launcher=draft.launcher,
        oracle_args=oracle_args,
        oracle_env=oracle_env,
        refuse=draft.refuse,
        why=draft.why,
    )


def plain(variant: Variant) -> bool:
    return variant.tag in ("default", "none", "plain", "root")


def shapes() -> List[Shape]:
    """Every variant once with the rest plain, then seeded random combinations."""
    result: List[Shape] = []
    for kind, dimensions in (("run", RUN_DIMENSIONS), ("el", EL_DIMENSIONS)):
        for name, variants in dimensions:
            for variant in variants:
                picks = [(dim, variant if dim == name else vs[0]) for dim, vs in dimensions]
                result.append(build(f"{kind}-{name}-{variant.tag}", picks))
    rng = random.Random(SEED)
    for n in range(COMBINED):
        dimensions = RUN_DIMENSIONS if n % 5 else EL_DIMENSIONS
        picks = [(dim, rng.choice([x for x in vs if not x.alone])) for dim, vs in dimensions]
        result.append(build(f"mix{n:03d}", picks))
    # A variant tried alone that equals the plain shape (or a repeated random
    # pick) is kept once, under its first id.
    seen = set()
    unique = []
    for shape in result:
        key = (tuple(shape.launcher + shape.args), tuple(sorted(shape.env.items())),
               tuple(sorted(shape.files.items())), shape.cwd)
        if key not in seen:
            seen.add(key)
            unique.append(shape)
    return unique

