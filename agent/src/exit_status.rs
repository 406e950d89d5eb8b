//! runlockd's exit statuses, for its `--help` and its man pages: one table.

/// The statuses `runlockd` (serving) or `runlockd check-config` (`check`)
/// exits with, and what each means.
pub fn statuses(check: bool) -> Vec<(&'static str, &'static str)> {
    let mut statuses = vec![
        (
            "0",
            if check {
                "the configuration can be used and the backend is ready"
            } else {
                "stopped by SIGTERM or SIGINT, its runs drained"
            },
        ),
        (
            "69",
            "check-config: the backend cannot be reached now (EX_UNAVAILABLE)",
        ),
        (
            "78",
            "a configuration it cannot use: a bad setting or file, a backend URI it cannot \
             open or trust (EX_CONFIG)",
        ),
    ];
    if !check {
        statuses.insert(
            1,
            ("1", "a failure of the moment after start (see the log)"),
        );
    }
    statuses
}

/// The exit statuses, as `--help` ends with them.
pub fn help(check: bool) -> String {
    let mut text = String::from("Exit status:\n");
    for (status, meaning) in statuses(check) {
        text.push_str(&format!("  {status:<6} {meaning}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn serving_and_checking_each_name_their_own_statuses() {
        let serving = super::help(false);
        let checking = super::help(true);
        assert!(serving.contains("  1 ") && !checking.contains("  1 "));
        for status in ["0", "69", "78"] {
            assert!(serving.contains(&format!("  {status} ")), "{serving}");
            assert!(checking.contains(&format!("  {status} ")), "{checking}");
        }
    }
}
