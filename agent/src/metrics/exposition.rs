//! Reading an exposition back, for the tests of this module and of a running
//! agent's `/metrics` (the tests crate, through `test-support`).

/// The value of one series, written as it appears: `name{label="value",...}`.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// What `text` shows otherwise than `expected`, one line each: `expected`
/// is written as an exposition is, `series value` a line; blank lines and
/// `#` comments are skipped, as is leading space.
pub fn differences(text: &str, expected: &str) -> Vec<String> {
    expected
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let Some((series, want)) = line.rsplit_once(' ') else {
                return Some(format!("{line:?} is not `series value`"));
            };
            let found = value(text, series);
            let matches = want.parse::<f64>().is_ok_and(|want| found == Some(want));
            (!matches).then(|| format!("{series} is {found:?}, not {want}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_series_other_than_expected_is_named() {
        let text = "# TYPE a counter\na_total 1\nb{x=\"y\"} 2.5\n";
        assert!(differences(text, "a_total 1\n  # comment\n\n  b{x=\"y\"} 2.5\n").is_empty());
        assert_eq!(
            differences(text, "a_total 2\nc 0\nnonsense"),
            [
                "a_total is Some(1.0), not 2",
                "c is None, not 0",
                "\"nonsense\" is not `series value`",
            ]
        );
    }
}
