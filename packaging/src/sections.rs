//! The sections every page ends with, as the neighbours' pages have them
//! (flock(1), systemctl(1)): EXIT STATUS, ENVIRONMENT, FILES and EXAMPLES.
//! The shim's exit statuses come from the table its `--help` prints; the
//! agent's variables from its clap definitions; the rest is written here,
//! once per page.

use clap_mangen::roff::{bold, roman, Roff};

/// Where the agent's settings are, for FILES.
pub const CONFIG_PATH: &str = "/etc/runlock/runlockd.toml";

/// A page's own part of the four sections.
pub struct Sections {
    pub exit_status: Vec<(String, String)>,
    /// Said before the statuses, when there is something to say.
    pub exit_lead: Option<&'static str>,
    pub environment: Vec<(String, String)>,
    pub files: Vec<(&'static str, &'static str)>,
    /// Each: the command line, and what it does.
    pub examples: Vec<(&'static str, &'static str)>,
}

impl Sections {
    /// Appends the four sections to `page`.
    pub fn render(&self, page: &mut Roff) {
        page.control("SH", ["EXIT STATUS"]);
        if let Some(lead) = self.exit_lead {
            page.text([roman(lead)]);
        }
        for (status, meaning) in &self.exit_status {
            entry(page, status, meaning);
        }
        page.control("SH", ["ENVIRONMENT"]);
        if self.environment.is_empty() {
            page.text([roman("None is read.")]);
        }
        for (name, meaning) in &self.environment {
            entry(page, name, meaning);
        }
        page.control("SH", ["FILES"]);
        for (path, meaning) in &self.files {
            entry(page, path, meaning);
        }
        page.control("SH", ["EXAMPLES"]);
        for (command, meaning) in &self.examples {
            page.control("PP", [])
                .text([roman(*meaning)])
                .control("PP", [])
                .control("RS", ["4"])
                .control("nf", [])
                .text([bold(*command)])
                .control("fi", [])
                .control("RE", []);
        }
    }
}

fn entry(page: &mut Roff, term: &str, meaning: &str) {
    page.control("TP", [])
        .text([bold(term)])
        .text([roman(meaning)]);
}

/// The sections of the shim's page `name` (`runlock`, `runlock-run`, ...).
pub fn shim(name: &str) -> Sections {
    use runlock_shim::exit;
    let run = matches!(name, "runlock" | "runlock-run");
    let mut exit_status = vec![("0".to_string(), "success".to_string())];
    let mut exit_lead = None;
    if run {
        exit_status.clear();
        exit_lead = Some(exit::COMMAND_STATUS);
    }
    exit_status.extend(exit::statuses(run).map(|d| (d.status.to_string(), d.meaning.to_string())));
    let mut environment = vec![
        (
            "RUNLOCK_SOCKET",
            "The agent's socket, under --socket (see FILES for the default).",
        ),
        (
            "RUNLOCK_CONFIG",
            "The agent's configuration file, read for its socket and on_unavailable \
             [default: /etc/runlock/runlockd.toml].",
        ),
        (
            "XDG_RUNTIME_DIR",
            "Where the socket of a user's own agent is: $XDG_RUNTIME_DIR/runlock/agent.sock.",
        ),
    ];
    if run {
        environment.extend([
            (
                "RUNLOCK_ON_UNAVAILABLE",
                "fail, warn or skip: whether COMMAND runs without a lock when the agent \
                 cannot be reached; over the configuration file's on_unavailable.",
            ),
            (
                "RUNLOCK_KEY, RUNLOCK_TOKEN, RUNLOCK_LEASE_ID",
                "Set for COMMAND: its keys, their fencing tokens and lease ids, one a line.",
            ),
            (
                "RUNLOCK_SLOT",
                "Set for COMMAND when a key has slots: the slot it holds, one a line.",
            ),
            (
                "MELTANO_RUN_FORCE",
                "With --meltano: true makes the run --force, as it makes meltano run's.",
            ),
        ]);
    }
    Sections {
        exit_status,
        exit_lead,
        environment: owned(environment),
        files: vec![
            (
                CONFIG_PATH,
                "The agent's settings; the shim reads its socket and on_unavailable.",
            ),
            (
                "/run/runlock/agent.sock",
                "The agent's socket for root and the system agent.",
            ),
            (
                "$XDG_RUNTIME_DIR/runlock/agent.sock",
                "The socket of a user's own agent, for users other than root.",
            ),
        ],
        examples: shim_examples(name),
    }
}

fn shim_examples(name: &str) -> Vec<(&'static str, &'static str)> {
    match name {
        "runlock" | "runlock-run" => vec![
            (
                "runlock run --key nightly -- ./backup.sh",
                "Run the backup only if no other run holds nightly, on any host sharing the \
                 backend; exit 75 at once otherwise.",
            ),
            (
                "runlock run --key nightly --wait 5 -- ./backup.sh",
                "Wait up to 5 seconds for the key, as flock -w 5 would (--wait 10m, 0.5 too).",
            ),
            (
                "runlock run --key nightly --wait infinity -- ./backup.sh",
                "Wait as long as it takes; on a terminal, a line says for whom and for how long.",
            ),
            (
                "runlock run --meltano --wait 30m -- meltano run tap-x target-y",
                "Hold the state ID of each extract-load block, as Meltano derives it.",
            ),
            (
                "runlock run --key api --slots 3 -- ./call-api.sh",
                "Let up to three runs hold api at once.",
            ),
        ],
        "runlock-status" => vec![(
            "runlock status --json",
            "The leases held through this host's agent, as JSON.",
        )],
        "runlock-list" => vec![
            (
                "runlock list dev:",
                "The held keys that start with dev:, from every host.",
            ),
            (
                "runlock list --all --json",
                "Every key, free ones too, with their last incident, as JSON.",
            ),
        ],
        "runlock-inspect" => vec![(
            "runlock inspect nightly",
            "Whether nightly is held, by whom, its token and when its lease expires.",
        )],
        "runlock-history" => vec![(
            "runlock history nightly --limit 5",
            "The latest five grants, releases, forces, breaks, expiries and losses of nightly.",
        )],
        "runlock-ui" => vec![(
            "runlock ui --listen 127.0.0.1:8470",
            "Serve the fleet page on port 8470; open the address printed, token included.",
        )],
        "runlock-release" => vec![
            (
                "runlock release nightly",
                "Break the lease on nightly, whoever holds it.",
            ),
            (
                "runlock release pool --slot 2",
                "Break slot 2 of the key pool.",
            ),
        ],
        _ => vec![("runlock --help", "What runlock can do.")],
    }
}

/// The sections of the agent's page `name` (`runlockd`, `runlockd-check-config`),
/// with `variables` the ones its flags read (from its clap definitions).
pub fn agent(name: &str, variables: Vec<(String, String)>) -> Sections {
    let check = name == "runlockd-check-config";
    let exit_status = runlock_agent::exit_status::statuses(check);
    let mut environment = variables;
    environment.extend(owned(vec![
        (
            "RUST_LOG",
            "What to log [default: info]; only runlockd's own parts log below info.",
        ),
        (
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL",
            "s3:// credentials, region and endpoint, with the rest of the AWS SDK's chain \
             (shared files, web identity, container and instance roles).",
        ),
        (
            "GOOGLE_APPLICATION_CREDENTIALS",
            "gs:// service-account key file (else the metadata server's account).",
        ),
        (
            "AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN",
            "azure:// account and credentials (else a managed identity).",
        ),
        (
            "NOTIFY_SOCKET, LISTEN_FDS",
            "Set by systemd: readiness notification and socket activation.",
        ),
    ]));
    let examples = if check {
        vec![
            (
                "runlockd check-config",
                "The settings the agent would use, secrets hidden, and whether its backend is ready.",
            ),
            (
                "runlockd check-config --from-meltano ~/project",
                "The configuration matching a Meltano project's state backend.",
            ),
        ]
    } else {
        vec![
            (
                "runlockd --backend s3://my-bucket/locks",
                "Serve locks kept in an S3 bucket, on the default socket.",
            ),
            (
                "runlockd --backend file:///var/lib/runlock --socket /tmp/runlock.sock",
                "Serve one host's locks from a local directory, on a socket of its own.",
            ),
            (
                "systemctl enable --now runlockd.socket",
                "Start the packaged agent through its socket.",
            ),
        ]
    };
    Sections {
        exit_status: exit_status
            .into_iter()
            .map(|(s, m)| (s.to_string(), m.to_string()))
            .collect(),
        exit_lead: None,
        environment,
        files: vec![
            (CONFIG_PATH, "The agent's settings; see runlockd.toml(5)."),
            ("/run/runlock/agent.sock", "The socket of the system agent (run as root or by systemd)."),
            (
                "/var/lib/runlock",
                "The default file:// store of the system agent ($XDG_STATE_HOME/runlock for a user's).",
            ),
        ],
        examples,
    }
}

/// The sections of runlockd.toml(5).
pub fn config_file() -> Sections {
    Sections {
        exit_status: Vec::new(),
        exit_lead: Some(
            "Not a command: runlockd exits 78 (EX_CONFIG) on a file it cannot use, and \
             runlockd check-config says why.",
        ),
        environment: owned(vec![
            (
                "RUNLOCK_CONFIG",
                "Another file to read instead of /etc/runlock/runlockd.toml.",
            ),
            (
                "RUNLOCK_SOCKET, RUNLOCK_BACKEND, RUNLOCK_TTL, ...",
                "Each setting's variable, over the file; runlockd(8) lists them.",
            ),
        ]),
        files: vec![(
            CONFIG_PATH,
            "Read by runlockd at start, and by runlock for socket and on_unavailable.",
        )],
        examples: vec![(
            "runlockd check-config",
            "The settings the agent would use from this file, secrets hidden.",
        )],
    }
}

/// The variables `command`'s flags read, each with its flag's help.
pub fn variables_of(command: &clap::Command) -> Vec<(String, String)> {
    command
        .get_arguments()
        .filter_map(|arg| {
            let name = arg.get_env()?.to_string_lossy().into_owned();
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            Some((
                name,
                format!("As --{}: {help}", arg.get_long().unwrap_or_default()),
            ))
        })
        .collect()
}

fn owned(pairs: Vec<(&str, &str)>) -> Vec<(String, String)> {
    pairs
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}
