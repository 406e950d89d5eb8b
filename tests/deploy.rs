//! The deployment examples, checked against the real binaries:
//! `deploy/kubernetes/`'s CronJob (its socket, flags and environment), the
//! stand-in Meltano project that runs an example's command line through a
//! real agent (also used by tests/systemd.rs for `systemd/examples/`), and
//! the alert rules in `deploy/prometheus/`, checked and tested by promtool.

use crate::metrics::promtool;
use crate::support::agent::{temp_dir, AgentOptions};
use crate::support::bins::bins;
use crate::support::run::Finished;
use crate::support::{closed_port, Run, TestAgent};
use anyhow::{bail, ensure, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tokio::process::Command;
use yaml_serde::Value;

/// The project the examples run: `meltano run tap-gitlab target-postgres` in `prod`.
const PROJECT: &str = "version: 1
default_environment: dev
environments:
- name: dev
- name: prod
plugins:
  extractors:
  - name: tap-gitlab
  loaders:
  - name: target-postgres
";

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
    std::fs::write(project.path().join("meltano.yml"), PROJECT)?;
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
    spec: Value,
}

impl Pod {
    fn load() -> Result<Pod> {
        let path = repo_path("deploy/kubernetes/meltano-cronjob.yaml")?;
        let text = std::fs::read_to_string(&path)?;
        let cronjob: Value = yaml_serde::from_str(&text).context("parsing the manifest")?;
        ensure!(cronjob["kind"].as_str() == Some("CronJob"), "not a CronJob");
        let spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone();
        ensure!(spec.is_mapping(), "no pod template in the CronJob");
        Ok(Pod { spec })
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
    let (sidecar, pipeline) = (pod.sidecar()?, pod.pipeline()?);
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

    let out = run_example_line(&agent, &strings(&pipeline["command"])?, &env_of(pipeline)).await?;
    out.expect_code(0)?;
    ensure!(
        out.stdout.trim() == format!("keys {EXAMPLE_KEY}"),
        "{out:?}\n{}",
        agent.log()
    );
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
