//! Meltano's `expand_env_vars`: `${NAME}` (any word characters) and `$NAME`
//! (an upper-case letter, then upper-case letters, digits and `_`), each
//! kept as written when a backslash precedes it, the backslash dropped.

/// `text` with every variable replaced by what `value_of` says: `Ok(None)`
/// for one that is not set (Meltano's default makes it empty; the caller
/// decides), `Err` to refuse.
pub fn expand(
    text: &str,
    value_of: &mut dyn FnMut(&str) -> Result<Option<String>, String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(found) = next_variable(rest) {
        if found.escaped {
            out.push_str(&rest[..found.start - 1]);
            out.push_str(&rest[found.start..found.end]);
        } else {
            out.push_str(&rest[..found.start]);
            out.push_str(&value_of(found.name)?.unwrap_or_default());
        }
        rest = &rest[found.end..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether an expansion of `text` would change it (a variable, or an escaped one).
pub fn has_variable(text: &str) -> bool {
    next_variable(text).is_some()
}

/// A variable in text: `$` at `start`, its name, and where it ends.
struct Variable<'a> {
    start: usize,
    end: usize,
    name: &'a str,
    /// A backslash stands before the `$`.
    escaped: bool,
}

fn next_variable(text: &str) -> Option<Variable<'_>> {
    let mut from = 0;
    while let Some(at) = text[from..].find('$') {
        let start = from + at;
        let after = &text[start + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let name_len = braced.find(|c: char| !is_word(c)).unwrap_or(braced.len());
            if name_len > 0 && braced[name_len..].starts_with('}') {
                (&braced[..name_len], name_len + 2)
            } else {
                ("", 0)
            }
        } else if after.starts_with(|c: char| c.is_ascii_uppercase()) {
            let name_len = after
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(after.len());
            (&after[..name_len], name_len)
        } else {
            ("", 0)
        };
        if !name.is_empty() {
            return Some(Variable {
                start,
                end: start + 1 + len,
                name,
                escaped: text[..start].ends_with('\\'),
            });
        }
        from = start + 1;
    }
    None
}

/// Python's `\w` on text: letters, digits and `_`.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::{expand, has_variable};

    #[test]
    fn variables_expand_as_meltano_expands_them() {
        let mut value_of = |name: &str| Ok((name == "A" || name == "low").then(|| "x".to_string()));
        let text = r"${A}-$A-$B-${low}-$low-\$A-\${A}-$-${}-$A_1-\\$A";
        assert_eq!(
            expand(text, &mut value_of).expect("expands"),
            r"x-x--x-$low-$A-${A}-$-${}--\$A"
        );
        assert!(has_variable(r"\$A") && has_variable("${a}") && !has_variable("$a-$"));
    }
}
