//! TLS to etcd, as etcdctl takes it: on when the URI says `?tls=true` or a
//! certificate file is given (`[etcd] ca_file`, `cert_file`, `key_file`, else
//! etcdctl's `ETCDCTL_CACERT`, `ETCDCTL_CERT`, `ETCDCTL_KEY`). Without a CA
//! file the system's roots are trusted; a client certificate and key are sent
//! when the server asks for them (`--client-cert-auth`). The files are read
//! when the agent starts, so a missing one stops it with its name.

use crate::backend::EtcdOptions;
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The client certificate file to present, if any: `[etcd] cert_file`, else `ETCDCTL_CERT`.
pub fn client_certificate(options: &EtcdOptions) -> Option<PathBuf> {
    options.cert_file.clone().or_else(|| {
        std::env::var_os("ETCDCTL_CERT")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// The TLS settings for `options` and the URI's `?tls=`, or `None` for plain HTTP.
pub fn settings(asked: bool, options: &EtcdOptions) -> anyhow::Result<Option<ClientTlsConfig>> {
    let env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let ca = options.ca_file.clone().or_else(|| env("ETCDCTL_CACERT"));
    let cert = client_certificate(options);
    let key = options.key_file.clone().or_else(|| env("ETCDCTL_KEY"));
    if !asked && ca.is_none() && cert.is_none() && key.is_none() {
        return Ok(None);
    }
    let mut tls = ClientTlsConfig::new();
    tls = match &ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca, "CA")?)),
        None => tls.with_native_roots(),
    };
    match (&cert, &key) {
        (Some(cert), Some(key)) => {
            let identity = Identity::from_pem(read(cert, "client certificate")?, read(key, "key")?);
            tls = tls.identity(identity);
        }
        (None, None) => {}
        _ => anyhow::bail!(
            "etcd TLS: a client certificate needs its key and the key its certificate \
             ([etcd] cert_file and key_file, or ETCDCTL_CERT and ETCDCTL_KEY)"
        ),
    }
    Ok(Some(tls))
}

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    let pem = std::fs::read(path).map_err(|err| {
        anyhow::anyhow!(
            "etcd TLS: reading the {what} file {}: {err}",
            path.display()
        )
    })?;
    if !pem.starts_with(b"-----BEGIN") && !String::from_utf8_lossy(&pem).contains("-----BEGIN ") {
        anyhow::bail!("etcd TLS: the {what} file {} is not PEM", path.display());
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_unless_asked_or_given_a_file() {
        let none = EtcdOptions::default();
        // The test process may have etcdctl's variables; this test does not set them.
        if std::env::var_os("ETCDCTL_CACERT").is_none() {
            assert!(settings(false, &none).expect("plain").is_none());
        }
        assert!(settings(true, &none).expect("system roots").is_some());
    }

    #[test]
    fn a_missing_or_half_given_file_is_named() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let not_pem = dir.path().join("ca.txt");
        std::fs::write(&not_pem, "hello").expect("write");
        let cert = dir.path().join("client.pem");
        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\n").expect("write");
        let cases = [
            (
                EtcdOptions {
                    ca_file: Some(dir.path().join("nope.pem")),
                    ..EtcdOptions::default()
                },
                "nope.pem",
            ),
            (
                EtcdOptions {
                    ca_file: Some(not_pem),
                    ..EtcdOptions::default()
                },
                "is not PEM",
            ),
            (
                EtcdOptions {
                    cert_file: Some(cert),
                    ..EtcdOptions::default()
                },
                "needs its key",
            ),
        ];
        for (options, said) in cases {
            let err = settings(false, &options).expect_err(said);
            assert!(err.to_string().contains(said), "{err}");
        }
    }
}
