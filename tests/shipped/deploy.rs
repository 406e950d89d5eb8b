//! The deployment examples, checked against the real binaries:
//! `deploy/kubernetes/`'s CronJob (its socket, flags and environment, and
//! its pipeline's shell: a held key a success, SIGTERM handed on), the
//! stand-in Meltano project that runs an example's command line through a
//! real agent (also used by tests/shipped/systemd.rs for `systemd/examples/`), and
//! the monitoring in `deploy/prometheus/` and `deploy/grafana/`: promtool on
//! the alert rules and their tests, and every metric and label their queries
//! name checked against what a real agent exports.

use crate::agent::metrics::{agent_with_metrics, promtool, scrape};
use crate::support::agent::{temp_dir, AgentOptions};
use crate::support::bins::bins;
use crate::support::client::{acquire, release};
use crate::support::run::Finished;
use crate::support::{closed_port, Run, TestAgent};
use anyhow::{bail, ensure, Context, Result};
use nix::sys::signal::Signal;
use runlock_protocol::AgentMessage;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use tokio::process::Command;
use yaml_serde::Value;

/// The project the examples run: `meltano run tap-gitlab target-postgres` in `prod`.
const PROJECT: &str = "tests/fixtures/meltano.yml";

/// The state ID Meltano, and so `runlock run --meltano`, gives the examples' run.
pub const EXAMPLE_KEY: &str = "prod:tap-gitlab-to-target-postgres";

pub fn repo_path(relative: &str) -> Result<PathBuf> {
    Ok(Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the tests package has no parent directory")?
        .join(relative))
}

/// Runs an example's command line (`runlock ... -- meltano run ...`) to its
/// end, through `agent`: `runlock` is the built shim, `meltano` a stand-in
/// that prints the key it was given, in a project that has the example's
/// plugins. `env` is the example's environment; its `RUNLOCK_SOCKET` is
/// replaced by the agent's.
pub async fn run_example_line(
    agent: &TestAgent,
    line: &[String],
    env: &[(String, String)],
) -> Result<Finished> {
    let project = temp_dir()?;
    std::fs::copy(repo_path(PROJECT)?, project.path().join("meltano.yml"))?;
    std::fs::create_dir(project.path().join("bin"))?;
    let meltano = project.path().join("bin/meltano");
    std::fs::write(&meltano, "#!/bin/sh\necho \"keys $RUNLOCK_KEY\"\n")?;
    std::fs::set_permissions(&meltano, std::fs::Permissions::from_mode(0o755))?;

    let named = |arg: &str, name: &str| Path::new(arg).file_name().is_some_and(|n| n == name);
    let (program, args) = line.split_first().context("an empty command line")?;
    ensure!(named(program, "runlock"), "{line:?} does not run runlock");
    let mut command = Command::new(&bins()?.runlock);
    for arg in args {
        if named(arg, "meltano") {
            command.arg(&meltano);
        } else {
            command.arg(arg);
        }
    }
    command
        .current_dir(project.path())
        .env_remove("MELTANO_ENVIRONMENT")
        .env_remove("MELTANO_PROJECT_ROOT")
        .env_remove("MELTANO_RUN_STATE_ID_SUFFIX")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("RUNLOCK_SOCKET", agent.socket())
        .kill_on_drop(true);
    Run::spawn(command)?.finish().await
}

/// The manifest's pod: its agent sidecar and its pipeline container.
struct Pod {
    /// The Job's spec (its podFailurePolicy, …).
    job: Value,
    /// The pod template's spec.
    spec: Value,
}

impl Pod {
    fn load() -> Result<Pod> {
        let path = repo_path("deploy/kubernetes/meltano-cronjob.yaml")?;
        let text = std::fs::read_to_string(&path)?;
        let cronjob: Value = yaml_serde::from_str(&text).context("parsing the manifest")?;
        ensure!(cronjob["kind"].as_str() == Some("CronJob"), "not a CronJob");
        let job = cronjob["spec"]["jobTemplate"]["spec"].clone();
        let spec = job["template"]["spec"].clone();
        ensure!(spec.is_mapping(), "no pod template in the CronJob");
        Ok(Pod { job, spec })
    }

    /// The init container with `restartPolicy: Always`: a native sidecar.
    fn sidecar(&self) -> Result<&Value> {
        let sidecars: Vec<&Value> = seq(&self.spec["initContainers"])
            .filter(|c| c["restartPolicy"].as_str() == Some("Always"))
            .collect();
        match sidecars[..] {
            [agent] => Ok(agent),
            _ => bail!("want one native sidecar, found {}", sidecars.len()),
        }
    }

    fn pipeline(&self) -> Result<&Value> {
        seq(&self.spec["containers"])
            .next()
            .context("no pipeline container")
    }

    /// Where `container` mounts the pod's volume `name`.
    fn mount_of(&self, container: &Value, name: &str) -> Option<String> {
        seq(&container["volumeMounts"])
            .find(|m| m["name"].as_str() == Some(name))
            .and_then(|m| m["mountPath"].as_str().map(String::from))
    }
}

fn seq(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_sequence().into_iter().flatten()
}

fn strings(value: &Value) -> Result<Vec<String>> {
    seq(value)
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            other => bail!("not a string: {other:?}"),
        })
        .collect()
}

/// A container's environment; a value from a Secret becomes `test`.
fn env_of(container: &Value) -> Vec<(String, String)> {
    seq(&container["env"])
        .filter_map(|e| {
            let name = e["name"].as_str()?.to_string();
            let value = e["value"].as_str().unwrap_or("test").to_string();
            Some((name, value))
        })
        .collect()
}

/// The value after `flag` in `args`, or the variable `var` in `env`: the
/// socket rule's first two steps, which is all a container can use.
fn socket_of(args: &[String], env: &[(String, String)]) -> Option<String> {
    args.windows(2)
        .find(|w| w[0] == "--socket")
        .map(|w| w[1].clone())
        .or_else(|| {
            env.iter()
                .find(|(k, _)| k == "RUNLOCK_SOCKET")
                .map(|(_, v)| v.clone())
        })
}

/// `args` without `--NAME VALUE` for each name in `drop`.
fn without_flags(args: &[String], drop: &[&str]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if drop.iter().any(|d| arg == d) {
            iter.next();
        } else {
            kept.push(arg.clone());
        }
    }
    kept
}

#[test]
fn the_agent_and_the_pipeline_share_one_socket_through_an_empty_dir() -> Result<()> {
    let pod = Pod::load()?;
    let (agent, pipeline) = (pod.sidecar()?, pod.pipeline()?);
    let agent_socket = socket_of(&strings(&agent["command"])?, &env_of(agent))
        .context("the agent names no socket")?;
    let pipeline_socket = socket_of(&strings(&pipeline["command"])?, &env_of(pipeline))
        .context("the pipeline names no socket (a non-root shim would look in $XDG_RUNTIME_DIR)")?;
    ensure!(
        agent_socket == pipeline_socket,
        "the agent serves {agent_socket}, the pipeline asks {pipeline_socket}"
    );
    let probe = strings(&agent["startupProbe"]["exec"]["command"])?;
    ensure!(
        socket_of(&probe, &[]).as_deref() == Some(agent_socket.as_str()),
        "the startup probe asks another socket: {probe:?}"
    );

    let dir = Path::new(&agent_socket)
        .parent()
        .context("a socket path without a directory")?
        .to_string_lossy()
        .into_owned();
    let shared: Vec<&Value> = seq(&pod.spec["volumes"])
        .filter(|v| v.get("emptyDir").is_some())
        .filter(|v| {
            let name = v["name"].as_str().unwrap_or_default();
            pod.mount_of(agent, name).as_deref() == Some(dir.as_str())
                && pod.mount_of(pipeline, name).as_deref() == Some(dir.as_str())
        })
        .collect();
    ensure!(
        shared.len() == 1,
        "no emptyDir mounted at {dir} in both containers"
    );
    ensure!(
        pod.spec["restartPolicy"].as_str() == Some("Never"),
        "a Job's pod restarting its pipeline would run it twice"
    );
    Ok(())
}

#[tokio::test]
async fn the_agent_accepts_the_manifests_flags_and_environment() -> Result<()> {
    let pod = Pod::load()?;
    let agent = pod.sidecar()?;
    let command = strings(&agent["command"])?;
    ensure!(
        command.first().map(String::as_str) == Some("runlockd"),
        "{command:?}"
    );
    let dir = temp_dir()?;
    let config = dir.path().join("runlockd.toml");
    std::fs::write(&config, "")?;
    // The store is unreachable here: 69 says the configuration itself is usable.
    let mut check = Command::new(&bins()?.runlockd);
    check
        .arg("check-config")
        .args(&command[1..])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env_of(agent))
        .env("RUNLOCK_CONFIG", &config)
        .env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", closed_port()?),
        )
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .kill_on_drop(true);
    let out = Run::spawn(check)?.finish().await?;
    ensure!(
        matches!(out.code(), Some(0 | 69)),
        "check-config refused the manifest's agent: {out:?}"
    );
    let socket = socket_of(&command, &[]).context("no --socket")?;
    for want in [
        format!("socket = \"{socket}\""),
        "backend = \"s3://meltano-state/prod\"".to_string(),
    ] {
        ensure!(out.stdout.contains(&want), "{want:?} missing: {out:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_container_runs_locked_through_the_sidecar() -> Result<()> {
    let pod = Pod::load()?;
    let sidecar = pod.sidecar()?;
    // The sidecar's own flags, on a test socket and memory:// instead of S3.
    let flags = without_flags(
        &strings(&sidecar["command"])?[1..],
        &["--socket", "--backend"],
    );
    let mut options = AgentOptions::new("memory://");
    options.args = flags;
    let agent = TestAgent::start_with(options).await?;

    // The startup probe passes once the agent serves.
    let probe = strings(&sidecar["startupProbe"]["exec"]["command"])?;
    ensure!(
        probe.first().map(String::as_str) == Some("runlock"),
        "{probe:?}"
    );
    let mut command = Command::new(&bins()?.runlock);
    command
        .args(without_flags(&probe[1..], &["--socket"]))
        .env("RUNLOCK_SOCKET", agent.socket())
        .kill_on_drop(true);
    Run::spawn(command)?.finish().await?.expect_code(0)?;

    let (run, _project) = spawn_pipeline_container(&pod, &agent, &[])?;
    let out = run.finish().await?;
    out.expect_code(0)?;
    ensure!(
        out.stdout.trim() == format!("keys {EXAMPLE_KEY}"),
        "{out:?}\n{}",
        agent.log()
    );
    Ok(())
}

/// The stand-in `meltano` of the pipeline container: it prints the keys it
/// was given, then exits with `$STANDIN_EXIT` (0 when unset), or, with
/// `$STANDIN_HOLD` set, waits for SIGTERM, says so and exits 143, as a
/// stopped meltano does.
const STANDIN_MELTANO: &str = r#"#!/bin/sh
trap 'echo "meltano got TERM"; kill "$sleeper" 2>/dev/null; exit 143' TERM
echo "keys $RUNLOCK_KEY"
if [ -n "$STANDIN_HOLD" ]; then
    sleep 60 &
    sleeper=$!
    wait "$sleeper"
fi
exit "${STANDIN_EXIT:-0}"
"#;

/// Starts the pipeline container's command as the container runs it (PID 1
/// aside), through `agent`: its `runlock` and `meltano` found on PATH (the
/// built shim, and [`STANDIN_MELTANO`]), in a copy of the examples'
/// project, with the container's environment (its `RUNLOCK_SOCKET` the
/// agent's) and `extra`. The project lives as long as the `TempDir`.
fn spawn_pipeline_container(
    pod: &Pod,
    agent: &TestAgent,
    extra: &[(&str, &str)],
) -> Result<(Run, TempDir)> {
    let pipeline = pod.pipeline()?;
    let command = strings(&pipeline["command"])?;
    let (program, args) = command
        .split_first()
        .context("the pipeline has no command")?;
    let project = temp_dir()?;
    std::fs::copy(repo_path(PROJECT)?, project.path().join("meltano.yml"))?;
    let bin = project.path().join("bin");
    std::fs::create_dir(&bin)?;
    std::os::unix::fs::symlink(&bins()?.runlock, bin.join("runlock"))?;
    let meltano = bin.join("meltano");
    std::fs::write(&meltano, STANDIN_MELTANO)?;
    std::fs::set_permissions(&meltano, std::fs::Permissions::from_mode(0o755))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut container = Command::new(program);
    container
        .args(args)
        .current_dir(project.path())
        .env_remove("MELTANO_ENVIRONMENT")
        .env_remove("MELTANO_PROJECT_ROOT")
        .env_remove("MELTANO_RUN_STATE_ID_SUFFIX")
        .envs(env_of(pipeline))
        .env("RUNLOCK_SOCKET", agent.socket())
        .env("PATH", path)
        .envs(extra.iter().copied());
    Ok((Run::spawn(container)?, project))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_container_ends_a_skipped_run_with_0_and_any_other_status_as_it_is(
) -> Result<()> {
    let pod = Pod::load()?;
    let agent = TestAgent::start("memory://").await?;

    // Another run holds the key: runlock exits 75, which the Job must not
    // count as a failure (nor retry), so the container ends with 0.
    let mut holder = agent.client().await?;
    let AgentMessage::Acquired { leases, .. } = holder.call(acquire(&[EXAMPLE_KEY])).await? else {
        bail!("the holder could not acquire {EXAMPLE_KEY}");
    };
    let (run, _project) = spawn_pipeline_container(&pod, &agent, &[])?;
    let out = run.finish().await?;
    out.expect_code(0)?;
    ensure!(!out.stdout.contains("keys"), "meltano ran: {out:?}");
    ensure!(
        out.stderr.contains("is held") && out.stderr.contains("skipped: another run holds the key"),
        "no holder named, or no line saying the run was skipped: {out:?}"
    );
    let ids = leases.iter().map(|l| l.lease_id.clone()).collect();
    let AgentMessage::Released { .. } = holder.call(release(ids)).await? else {
        bail!("the holder could not release {EXAMPLE_KEY}");
    };

    // Any other status is the run's own: a failed meltano fails the Job.
    let (run, _project) = spawn_pipeline_container(&pod, &agent, &[("STANDIN_EXIT", "3")])?;
    let out = run.finish().await?;
    out.expect_code(3)?;
    ensure!(
        out.stdout.trim() == format!("keys {EXAMPLE_KEY}") && !out.stderr.contains("skipped"),
        "{out:?}"
    );

    // 76 (this run lost its lock) fails the Job at once, without a retry.
    let fails_job_on = |code: i64| {
        seq(&pod.job["podFailurePolicy"]["rules"]).any(|rule| {
            rule["action"].as_str() == Some("FailJob")
                && rule["onExitCodes"]["containerName"].as_str() == Some("pipeline")
                && rule["onExitCodes"]["operator"].as_str() == Some("In")
                && seq(&rule["onExitCodes"]["values"]).any(|v| v.as_i64() == Some(code))
        })
    };
    ensure!(fails_job_on(76), "no FailJob rule for 76 on the pipeline");
    ensure!(
        pod.job["backoffLimit"].as_i64().is_some_and(|n| n >= 1),
        "with no retries at all, the FailJob rule would say nothing"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_container_hands_sigterm_on_to_meltano() -> Result<()> {
    let pod = Pod::load()?;
    let agent = TestAgent::start("memory://").await?;
    let (mut run, _project) = spawn_pipeline_container(&pod, &agent, &[("STANDIN_HOLD", "1")])?;
    run.expect_line(&format!("keys {EXAMPLE_KEY}")).await?;
    // What the kubelet sends the container's PID 1 when the pod is deleted.
    run.signal(Signal::SIGTERM)?;
    let out = run.finish().await?;
    out.expect_code(143)?;
    ensure!(out.stdout.contains("meltano got TERM"), "{out:?}");
    ensure!(!out.stderr.contains("skipped"), "{out:?}");
    Ok(())
}

/// `promtool ARGS...` in `dir`: its output, or an error with it.
fn run_promtool(dir: &Path, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(promtool()?)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("running promtool {args:?}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "promtool {args:?} failed:\n{text}");
    Ok(text)
}

#[test]
fn the_alert_rules_pass_promtool_check_rules_and_their_unit_tests() -> Result<()> {
    let dir = repo_path("deploy/prometheus")?;
    let checked = run_promtool(&dir, &["check", "rules", "runlock-alerts.yml"])?;
    ensure!(checked.contains("SUCCESS: 4 rules found"), "{checked}");
    let tested = run_promtool(&dir, &["test", "rules", "runlock-alerts.test.yml"])?;
    ensure!(tested.contains("SUCCESS"), "{tested}");
    // Each alert is shown both firing and quiet by its unit tests.
    let rules = std::fs::read_to_string(dir.join("runlock-alerts.yml"))?;
    let rules: Value = yaml_serde::from_str(&rules).context("parsing the alert rules")?;
    let tests = std::fs::read_to_string(dir.join("runlock-alerts.test.yml"))?;
    let tests: Value = yaml_serde::from_str(&tests).context("parsing the rule tests")?;
    let cases: Vec<&Value> = seq(&tests["tests"])
        .flat_map(|test| seq(&test["alert_rule_test"]))
        .collect();
    let alerts = seq(&rules["groups"])
        .flat_map(|group| seq(&group["rules"]))
        .filter_map(|rule| rule["alert"].as_str());
    for alert in alerts {
        let of_alert = || {
            cases
                .iter()
                .filter(|c| c["alertname"].as_str() == Some(alert))
        };
        let firing = |c: &&&Value| seq(&c["exp_alerts"]).next().is_some();
        ensure!(
            of_alert().any(|c| firing(&c)),
            "no test shows {alert} firing"
        );
        ensure!(
            of_alert().any(|c| !firing(&c)),
            "no test shows {alert} quiet"
        );
    }
    Ok(())
}

/// What a PromQL expression names: metrics, each selector's matcher labels,
/// and the labels of `by (...)` and `without (...)`.
#[derive(Debug, Default)]
struct Query {
    /// Each metric with the labels its selector matches on.
    selectors: Vec<(String, Vec<String>)>,
    grouped_by: Vec<String>,
}

impl Query {
    /// A small PromQL scanner: enough for the names and labels of our queries.
    fn parse(expr: &str) -> Query {
        let chars: Vec<char> = expr.chars().collect();
        let mut query = Query::default();
        let mut at = 0;
        let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_';
        let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
        let skip_string = |at: &mut usize| {
            let quote = chars[*at];
            *at += 1;
            while *at < chars.len() && chars[*at] != quote {
                *at += if chars[*at] == '\\' { 2 } else { 1 };
            }
            *at += 1;
        };
        let ident = |at: &mut usize| {
            let start = *at;
            while *at < chars.len() && ident_char(chars[*at]) {
                *at += 1;
            }
            chars[start..*at].iter().collect::<String>()
        };
        let skip_spaces = |at: &mut usize| {
            while *at < chars.len() && chars[*at].is_whitespace() {
                *at += 1;
            }
        };
        while at < chars.len() {
            let c = chars[at];
            if c == '"' || c == '\'' {
                skip_string(&mut at);
            } else if c == '$' || c == '[' {
                // A Grafana variable or a range: `[$__rate_interval]`, `[5m]`.
                while at < chars.len() && !matches!(chars[at], ']' | ')' | '}' | ',') {
                    at += 1;
                }
            } else if ident_start(c) {
                let name = ident(&mut at);
                skip_spaces(&mut at);
                let next = chars.get(at).copied();
                if (name == "by" || name == "without") && next == Some('(') {
                    at += 1;
                    while at < chars.len() && chars[at] != ')' {
                        if ident_start(chars[at]) {
                            query.grouped_by.push(ident(&mut at));
                        } else {
                            at += 1;
                        }
                    }
                } else if next == Some('{') {
                    let mut labels = Vec::new();
                    at += 1;
                    while at < chars.len() && chars[at] != '}' {
                        match chars[at] {
                            '"' | '\'' => skip_string(&mut at),
                            c if ident_start(c) => labels.push(ident(&mut at)),
                            _ => at += 1,
                        }
                    }
                    query.selectors.push((name, labels));
                } else if name.starts_with("runlock_") {
                    query.selectors.push((name, Vec::new()));
                }
            } else {
                at += 1;
            }
        }
        query
    }
}

/// Each sample name in an exposition with the labels it carries.
fn exported(exposition: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let Some(end) = line.find(['{', ' ']) else {
            continue;
        };
        let labels = names.entry(line[..end].to_string()).or_default();
        if let Some(inside) = line[end..]
            .strip_prefix('{')
            .and_then(|l| l.split('}').next())
        {
            for pair in inside.split(',') {
                labels.extend(pair.split('=').next().map(String::from));
            }
        }
    }
    names
}

/// Where `expr` names a runlock metric, or a label of one, that `names`
/// does not have; labels Prometheus adds (`job`, `instance`) and `le` pass.
fn unknown_names(expr: &str, names: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let query = Query::parse(expr);
    let added = ["job", "instance", "le"];
    let mut unknown = Vec::new();
    let mut used_labels: BTreeSet<&str> = added.into_iter().collect();
    for (metric, labels) in query
        .selectors
        .iter()
        .filter(|(m, _)| m.starts_with("runlock_"))
    {
        let Some(known) = names.get(metric) else {
            unknown.push(format!("metric {metric}"));
            continue;
        };
        used_labels.extend(known.iter().map(String::as_str));
        for label in labels.iter().filter(|l| !added.contains(&l.as_str())) {
            if !known.contains(label) {
                unknown.push(format!("label {label} of {metric}"));
            }
        }
    }
    let names_runlock = query
        .selectors
        .iter()
        .any(|(m, _)| m.starts_with("runlock_"));
    for label in &query.grouped_by {
        if names_runlock && !used_labels.contains(label.as_str()) {
            unknown.push(format!("label {label} in by/without"));
        }
    }
    unknown
}

#[test]
fn the_query_scanner_finds_metrics_matchers_and_groupings() {
    let query = Query::parse(
        r#"histogram_quantile(0.99, sum by (instance, le) (rate(runlock_x_bucket{result="o,k}", instance=~"$instance"}[$__rate_interval]))) / on(job) runlock_y"#,
    );
    assert_eq!(
        query.selectors,
        [
            (
                "runlock_x_bucket".to_string(),
                vec!["result".to_string(), "instance".to_string()]
            ),
            ("runlock_y".to_string(), vec![]),
        ]
    );
    assert_eq!(query.grouped_by, ["instance", "le"]);
}

/// The dashboard's panels, rows' nested panels included.
fn dashboard_panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut panels = Vec::new();
    let mut todo: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(panel) = todo.pop() {
        todo.extend(panel["panels"].as_array().into_iter().flatten());
        panels.push(panel);
    }
    panels
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alerts_query_only_what_a_real_agent_exports() -> Result<()> {
    let (_agent, addr, _locks) = agent_with_metrics("30s").await?;
    let exposition = scrape(addr).await?;
    let names = exported(&exposition);
    ensure!(names.contains_key("runlock_leases_held"), "{exposition}");

    let path = repo_path("deploy/grafana/runlock.json")?;
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    let variables = dashboard["templating"]["list"]
        .as_array()
        .context("no variables")?;
    ensure!(
        variables.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "no Prometheus data source variable named datasource"
    );

    let mut queries: Vec<(String, String)> = Vec::new();
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let expr = variable["definition"]
            .as_str()
            .context("a query variable without a definition")?;
        queries.push((format!("variable {}", variable["name"]), expr.to_string()));
    }
    let panels: Vec<_> = dashboard_panels(&dashboard)
        .into_iter()
        .filter(|p| p["type"] != "row")
        .collect();
    ensure!(panels.len() >= 10, "only {} panels", panels.len());
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("?");
        ensure!(
            panel["datasource"]["uid"] == "${datasource}",
            "{title}: not on the datasource variable"
        );
        let targets = panel["targets"].as_array().filter(|t| !t.is_empty());
        for target in targets.with_context(|| format!("{title}: no queries"))? {
            ensure!(
                target["datasource"]["uid"] == "${datasource}",
                "{title}: a query not on the datasource variable"
            );
            let expr = target["expr"]
                .as_str()
                .with_context(|| format!("{title}: a query without expr"))?;
            // Per host: every series a panel reads follows the host picker.
            for (metric, labels) in Query::parse(expr).selectors {
                ensure!(
                    labels.contains(&"instance".to_string()),
                    "{title}: {metric} is not filtered by $instance in {expr}"
                );
            }
            queries.push((format!("panel {title:?}"), expr.to_string()));
        }
    }
    let rules: Value = yaml_serde::from_str(&std::fs::read_to_string(repo_path(
        "deploy/prometheus/runlock-alerts.yml",
    )?)?)?;
    for rule in seq(&rules["groups"]).flat_map(|group| seq(&group["rules"])) {
        let expr = rule["expr"].as_str().context("a rule without expr")?;
        queries.push((
            format!("alert {}", rule["alert"].as_str().unwrap_or("?")),
            expr.to_string(),
        ));
    }

    let mut unknown = Vec::new();
    for (place, expr) in &queries {
        for name in unknown_names(expr, &names) {
            unknown.push(format!("{place}: {name}"));
        }
    }
    ensure!(
        unknown.is_empty(),
        "not exported by the agent:\n{}\nexported: {:?}",
        unknown.join("\n"),
        names.keys()
    );

    // The panels' PromQL parses: promtool checks it as recording rules, with
    // Grafana's variables given values.
    let mut recorded = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (at, (_, expr)) in queries
        .iter()
        .filter(|(place, _)| place.starts_with("panel"))
        .enumerate()
    {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*");
        recorded.push_str(&format!(
            "      - record: dashboard_query_{at}\n        expr: {}\n",
            serde_json::to_string(&expr)?
        ));
    }
    let dir = temp_dir()?;
    std::fs::write(dir.path().join("dashboard.yml"), recorded)?;
    run_promtool(dir.path(), &["check", "rules", "dashboard.yml"])?;
    Ok(())
}
