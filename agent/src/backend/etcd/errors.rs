//! What a failed request to etcd means (`Failure`'s shape): worth another
//! try, refused, or a lease gone, in words that name the members and what to
//! check, never the password.

use super::rpc;
use super::transport::Connection;
use crate::backend::failure::Failure;
use crate::backend::BackendError;
use tonic::Code;

/// The answer to one request that an operation handles itself.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct LeaseGone;

/// Why one request failed: not reachable, no leader, timed out (transient);
/// refused for credentials or permissions, or anything else etcd answered.
pub(super) type Problem = Failure<LeaseGone>;

impl Connection {
    pub(super) fn classify(&self, err: rpc::Error) -> Problem {
        use rpc::Error as E;
        match err {
            E::Status(status) if tls_refused(&cause_of(&status, status.message())) => {
                self.tls_refusal(&cause_of(&status, status.message()))
            }
            E::Status(status) if status.message() == "transport error" => {
                Problem::Transient(cause_of(&status, status.message()))
            }
            E::Status(status) => {
                let message = status.message().to_string();
                match status.code() {
                    Code::Cancelled
                    | Code::DeadlineExceeded
                    | Code::ResourceExhausted
                    | Code::Aborted
                    | Code::Unavailable => Problem::Transient(message),
                    _ if message.contains("lease not found") => Problem::Expected(LeaseGone),
                    _ if message.contains("authentication failed") => Problem::Refused(format!(
                        "{} refused {}: check the etcd user name and password",
                        self.place,
                        self.who()
                    )),
                    _ if message.contains("user name is empty")
                        || message.contains("invalid auth token") =>
                    {
                        Problem::Refused(format!(
                            "{} requires authentication: give an etcd user and password \
                             (etcd://user:password@host/prefix, [etcd] user and password, \
                             or ETCDCTL_USER)",
                            self.place
                        ))
                    }
                    Code::PermissionDenied => Problem::Refused(format!(
                        "{} denied {} access to {}: grant it a role with readwrite on that \
                         prefix (etcdctl role grant-permission ROLE --prefix=true readwrite {})",
                        self.place,
                        self.who(),
                        self.prefix,
                        self.prefix
                    )),
                    _ => Problem::Refused(format!("{} answered: {message}", self.place)),
                }
            }
            E::LeaseGone => Problem::Expected(LeaseGone),
            E::Transport(err) if tls_refused(&error_chain(&err)) => {
                self.tls_refusal(&error_chain(&err))
            }
            E::Transport(err) => Problem::Transient(error_chain(&err)),
            ended @ E::Ended(_) => Problem::Transient(ended.to_string()),
            E::Setup(err) => Problem::Refused(format!("{}: {}", self.place, error_chain(&err))),
        }
    }

    fn tls_refusal(&self, detail: &str) -> Problem {
        Problem::Refused(format!(
            "{}: the TLS handshake failed ({detail}): check the CA that signed etcd's \
             certificate ([etcd] ca_file or ETCDCTL_CACERT) and, where etcd asks for one, the \
             client certificate ([etcd] cert_file and key_file, or ETCDCTL_CERT and ETCDCTL_KEY)",
            self.place
        ))
    }

    pub(super) fn unavailable(&self, problem: Problem) -> BackendError {
        BackendError::Unavailable(match problem {
            // etcd drops a TLS client without the certificate it requires
            // after the handshake: the client sees only a closed connection.
            Problem::Transient(why) if self.tls.is_some() => format!(
                "cannot reach {} over TLS ({why}): check that etcd runs there and this host \
                 can reach it, and, where etcd requires client certificates, that [etcd] \
                 cert_file and key_file (or ETCDCTL_CERT and ETCDCTL_KEY) name one its CA signed",
                self.place
            ),
            Problem::Transient(why) => format!(
                "cannot reach {} ({why}): check that etcd runs there and this host can reach it",
                self.place
            ),
            Problem::Expected(LeaseGone) => format!("{}: the lease is gone", self.place),
            Problem::Refused(why) => why,
        })
    }
}

/// Whether a transport error is a TLS refusal (a certificate not trusted,
/// or none given where etcd requires one), which no retry mends.
fn tls_refused(chain: &str) -> bool {
    let chain = chain.to_ascii_lowercase();
    ["certificate", "handshake", "unknownissuer", "tls alert"]
        .iter()
        .any(|word| chain.contains(word))
}

/// What a gRPC status says went wrong: its source's chain where it has one
/// (a transport failure), not the status's debug form.
fn cause_of(status: &(dyn std::error::Error + 'static), message: &str) -> String {
    match status.source() {
        Some(source) => error_chain(source),
        None => message.to_string(),
    }
}

/// An error with its sources, as one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}
