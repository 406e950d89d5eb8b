//! The one rule for where a backend URI's secrets are: how the URIs are
//! split (`split_userinfo`) and how they are shown (`redact_uri`) agree, so
//! no part a parser takes for a host, path or setting can hold a password.

/// Query parameters whose values are hidden: libpq's `password` and
/// `sslpassword`, and anything naming a key, secret, token or signature
/// (an Azure SAS `sig`, `X-Amz-Credential`).
const SECRET_PARAMS: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "key",
    "sig",
    "credential",
];

/// A URI for logs, errors and replies: everything between `://` and the
/// last `@` is hidden (so a password may hold any byte, `/ ? # : @`
/// included, unencoded), and so is the value of any query parameter that may
/// carry a secret, up to the next `&`. Both rules apply to the whole text,
/// neither trusting where the other says a part ends: this hides more than a
/// strict parse would (an `@` in a path or query), never less.
pub fn redact_uri(uri: &str) -> String {
    let mut hidden = vec![false; uri.len()];
    let start = uri.find("://").map_or(0, |i| i + 3);
    if let Some(at) = uri[start..].rfind('@') {
        hidden[start..start + at].fill(true);
    }
    for (i, _) in uri.match_indices(['?', '&']) {
        let param = &uri[i + 1..];
        let Some(eq) = param.find(['=', '&', '?']) else {
            continue;
        };
        if param.as_bytes()[eq] == b'=' && is_secret_param(&param[..eq]) {
            let value = i + 1 + eq + 1;
            let end = uri[value..].find('&').map_or(uri.len(), |e| value + e);
            hidden[value..end].fill(true);
        }
    }
    let mut shown = String::with_capacity(uri.len());
    let mut hiding = false;
    for (i, c) in uri.char_indices() {
        // Every hidden run starts and ends at an ASCII delimiter, so a char's
        // first byte stands for all of it.
        if !hidden[i] {
            shown.push(c);
        } else if !hiding {
            shown.push_str("***");
        }
        hiding = hidden[i];
    }
    shown
}

/// Whether `uri` holds a password or a secret parameter (a user name alone is
/// no secret, though [`redact_uri`] hides it too).
pub fn holds_secret(uri: &str) -> bool {
    let rest = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let password = split_userinfo(rest)
        .0
        .is_some_and(|user| user.contains(':'));
    password
        || (uri.split(['?', '&']).skip(1)).any(|param| {
            param
                .split_once('=')
                .is_some_and(|(name, _)| is_secret_param(name))
        })
}

fn is_secret_param(name: &str) -> bool {
    let name = percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|secret| name.contains(secret))
}

/// Splits what follows `scheme://` into the userinfo (still encoded) and the
/// rest, by the rule [`redact_uri`] hides: the userinfo runs to the last
/// `@`, so a password may hold `/ ? # : @` unencoded, as SQLAlchemy (and so
/// Meltano) reads it. Only when the user name (up to the first `:`) would
/// then hold `/`, `?` or `#` is that `@` in the path or query instead
/// (`host/db?application_name=a@b`), and the userinfo, if any, is RFC
/// 3986's: up to the last `@` before the first `/`, `?` or `#`.
pub fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    if let Some(at) = rest.rfind('@') {
        let userinfo = &rest[..at];
        let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
        if !user.contains(['/', '?', '#']) {
            return (Some(userinfo), &rest[at + 1..]);
        }
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passwords holding every character that ends a part of a URI.
    const AWKWARD: &[&str] = &["pa/ss", "p?w", "p#w", "p:w", "p@w", "a/b?c#d:e@f"];

    #[test]
    fn no_password_survives_redaction_whatever_it_holds() {
        for password in AWKWARD {
            for uri in [
                format!("postgresql://user:{password}@db:5432/x?sslmode=require"),
                format!("etcd://user:{password}@h1:2379,h2/prefix?watch=false"),
                format!("s3://user:{password}@bucket/prefix"),
                format!("postgresql://db/x?user=u&password={password}"),
                format!("postgresql://db/x?sslpassword={password}&sslmode=require"),
                format!("azure://c/p?sv=1&sig={password}"),
                format!("postgresql://u:pw@db/x?password={password}@tail"),
                format!("u:{password}@host"),
            ] {
                let shown = redact_uri(&uri);
                assert!(!shown.contains(password), "{uri} shown as {shown}");
            }
        }
    }

    #[test]
    fn a_password_or_a_secret_parameter_is_a_secret_and_a_user_name_is_not() {
        for uri in [
            "postgresql://runlock:pw@db/x",
            "postgresql://db/x?user=u&password=pw",
            "azure://c/p?sv=1&sig=abc",
            "etcd://u:p@h1:2379/locks",
        ] {
            assert!(holds_secret(uri), "{uri}");
        }
        for uri in [
            "postgresql://runlock@db/x?sslmode=require",
            "s3://bucket/prefix?region=eu-west-1",
            "file:///var/lib/runlock",
            "/var/lib/meltano/meltano.db",
        ] {
            assert!(!holds_secret(uri), "{uri}");
        }
    }

    #[test]
    fn redaction_keeps_what_is_not_secret() {
        assert_eq!(
            redact_uri("postgresql://u:secret@db:5432/x"),
            "postgresql://***@db:5432/x"
        );
        assert_eq!(
            redact_uri("file:///var/lib/runlock"),
            "file:///var/lib/runlock"
        );
        assert_eq!(
            redact_uri("postgresql://db/m?user=u&password=pa55&sslmode=disable"),
            "postgresql://db/m?user=u&password=***&sslmode=disable"
        );
        assert_eq!(
            redact_uri("postgresql://u:pa55@db?sslpassword=x&Token=y&X-Amz-Signature=z"),
            "postgresql://***@db?sslpassword=***&Token=***&X-Amz-Signature=***"
        );
        assert_eq!(redact_uri("s3://bucket/prefix"), "s3://bucket/prefix");
        // An `@` in a query password hides what the userinfo rule alone would show.
        assert_eq!(
            redact_uri("postgresql://db/x?password=hunter2@part&sslmode=require"),
            "postgresql://***&sslmode=require"
        );
    }

    #[test]
    fn the_userinfo_runs_to_the_last_at_unless_no_user_name_could_hold_it() {
        for password in AWKWARD {
            let rest = format!("user:{password}@host:5432/db?sslmode=require");
            assert_eq!(
                split_userinfo(&rest),
                (
                    Some(format!("user:{password}").as_str()),
                    "host:5432/db?sslmode=require"
                )
            );
        }
        assert_eq!(split_userinfo("host/db"), (None, "host/db"));
        assert_eq!(
            split_userinfo("host/db?application_name=a@b"),
            (None, "host/db?application_name=a@b")
        );
        assert_eq!(
            split_userinfo("u@host/db?application_name=a@b"),
            (Some("u"), "host/db?application_name=a@b")
        );
    }
}
