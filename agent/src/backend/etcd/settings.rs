//! What an `etcd://` URI and the `[etcd]` settings name: the members, the
//! key prefix, who to authenticate as, and whether to watch. TLS is read in
//! `tls.rs`.

use crate::backend::{EtcdOptions, Secret};

/// etcd's client port, when the URI names none.
const DEFAULT_PORT: u16 = 2379;
/// The key prefix when the URI names none.
const DEFAULT_PREFIX: &str = "runlock";

/// What an `etcd://` URI names.
pub(super) struct Target {
    /// `host:port` each.
    pub(super) hosts: Vec<String>,
    /// Ends with `/`.
    pub(super) prefix: String,
    /// From the URI's userinfo; the password may be absent.
    pub(super) user: Option<(String, Option<Secret>)>,
    /// Whether waiters are woken by a watch (`?watch=false` leaves them to polling).
    pub(super) watch: bool,
    /// `?tls=true`: TLS even without certificate files (the system's roots).
    pub(super) tls: bool,
}

pub(super) fn parse_uri(uri: &str) -> anyhow::Result<Target> {
    let shown = crate::backend::redact_uri(uri);
    let rest = uri
        .strip_prefix("etcd://")
        .ok_or_else(|| anyhow::anyhow!("{shown:?} is not an etcd:// URI"))?;
    // The userinfo first, as `redact_uri` hides it: a password may hold `/` or `?`.
    let (userinfo, rest) = crate::backend::split_userinfo(rest);
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let hosts = hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                anyhow::bail!("{shown:?} names no etcd host (etcd://host:port/prefix)");
            }
            // `[v6]` or a name without a port gets etcd's; a given port must be a number.
            match host.rsplit_once(':').filter(|(h, _)| !h.ends_with(':')) {
                Some((name, port)) if !host.ends_with(']') => {
                    port.parse::<u16>()
                        .map_err(|_| anyhow::anyhow!("{shown:?}: {port:?} is not a port number"))?;
                    Ok(format!("{name}:{port}"))
                }
                _ => Ok(format!("{host}:{DEFAULT_PORT}")),
            }
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let user = match userinfo {
        None => None,
        Some(info) => {
            let (name, password) = match info.split_once(':') {
                Some((name, password)) => (name, Some(percent_decode(password)?.into())),
                None => (info, None),
            };
            Some((percent_decode(name)?, password))
        }
    };
    let (mut watch, mut tls) = (true, false);
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("watch", "false")) => watch = false,
            Some(("watch", "true")) => watch = true,
            Some(("tls", "false")) => tls = false,
            Some(("tls", "true")) => tls = true,
            // Only the name: a value is not for the log, whatever was put in it.
            _ => anyhow::bail!(
                "{shown:?}: unknown setting {:?} (there are watch=false and tls=true)",
                pair.split_once('=').map_or(pair, |(name, _)| name)
            ),
        }
    }
    let prefix = match path.trim_matches('/') {
        "" => DEFAULT_PREFIX,
        given => given,
    };
    Ok(Target {
        hosts,
        prefix: format!("{prefix}/"),
        user,
        watch,
        tls,
    })
}

/// `%XX` escapes in a URI's userinfo (a password may hold `@` or `:`).
fn percent_decode(text: &str) -> anyhow::Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| anyhow::anyhow!("the etcd URI's userinfo has a bad % escape"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| anyhow::anyhow!("the etcd URI's userinfo is not UTF-8"))
}

/// Who to authenticate as: the URI's userinfo, else `[etcd]`, else etcdctl's variables.
pub(super) fn credentials(
    from_uri: Option<(String, Option<Secret>)>,
    options: &EtcdOptions,
) -> anyhow::Result<Option<(String, Secret)>> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (user, password) = match (from_uri, &options.user) {
        (Some((user, password)), _) => (user, password.or_else(|| options.password.clone())),
        (None, Some(user)) => (user.clone(), options.password.clone()),
        (None, None) => match env("ETCDCTL_USER") {
            // etcdctl's form: `user` or `user:password`.
            Some(given) => match given.split_once(':') {
                Some((user, password)) => (user.to_string(), Some(password.into())),
                None => (given, None),
            },
            None => return Ok(None),
        },
    };
    let password = password.or_else(|| env("ETCDCTL_PASSWORD").map(Secret::from));
    match password {
        Some(password) => Ok(Some((user, password))),
        None => anyhow::bail!(
            "etcd user {user:?} has no password: give it in the URI (etcd://user:password@host/prefix), \
             as [etcd] password, or in ETCDCTL_PASSWORD"
        ),
    }
}
