//! TLS toward PostgreSQL with libpq's `sslmode` meanings, over rustls (through
//! tokio-postgres-rustls) with ring, the provider every store's client uses,
//! so no second TLS stack or system OpenSSL is needed.
//!
//! As in libpq: `prefer` and `require` encrypt without checking who answers
//! (`require` checks the chain when `sslrootcert` is given), `verify-ca` checks
//! the chain, `verify-full` the chain and the host name. Roots come from
//! `sslrootcert` (a PEM file, or `system` for the system's roots), else
//! `~/.postgresql/root.crt`.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`: all six (tokio-postgres itself parses three).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// libpq tries plain first; taken here as `prefer`.
    Allow,
    /// TLS if the server offers it, unverified.
    Prefer,
    /// TLS or nothing; the chain is checked only against an explicit `sslrootcert`.
    Require,
    /// TLS, with the server's chain checked.
    VerifyCa,
    /// TLS, with the chain and the host name checked.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = String;

    fn from_str(text: &str) -> Result<SslMode, String> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode {other:?} is not one of disable, allow, prefer, require, \
                     verify-ca, verify-full"
                ))
            }
        })
    }
}

impl SslMode {
    /// The mode tokio-postgres applies (it only decides whether TLS is tried
    /// and whether it is required; the verifier does the rest).
    pub fn tokio_postgres_name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow | SslMode::Prefer => "prefer",
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => "require",
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The roots `sslrootcert` names, or libpq's default file.
fn roots(
    root_cert: Option<&str>,
    home: Option<&Path>,
    mode: SslMode,
) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    if root_cert == Some("system") {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err("sslrootcert=system: no system root certificates were found".into());
        }
        return Ok(store);
    }
    let default = home.map(|h| h.join(".postgresql/root.crt"));
    let path =
        match (root_cert, &default) {
            (Some(path), _) => Path::new(path).to_path_buf(),
            (None, Some(default)) if default.exists() => default.clone(),
            _ => {
                return Err(format!(
                "sslmode={} needs the server's root certificate: set sslrootcert=/path/to/ca.pem \
                 (or sslrootcert=system for the system's roots), or PGSSLROOTCERT",
                if mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" }
            ))
            }
        };
    let certs = CertificateDer::pem_file_iter(&path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|err| format!("reading sslrootcert {}: {err}", path.display()))?;
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "sslrootcert {} holds no usable certificate",
            path.display()
        ));
    }
    Ok(store)
}

/// The connector for `mode`, with the roots it needs loaded now (so a missing
/// file is a configuration error at start, not a failure at the first run).
pub fn connector(
    mode: SslMode,
    root_cert: Option<&str>,
    home: Option<&Path>,
) -> Result<MakeRustlsConnect, String> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS setup: {err}"))?;
    let checks_chain = matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull)
        || (mode == SslMode::Require && root_cert.is_some());
    let config = if mode == SslMode::VerifyFull {
        let roots = Arc::new(roots(root_cert, home, mode)?);
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        let chain = if checks_chain {
            let roots = Arc::new(roots(root_cert, home, mode)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|err| format!("TLS setup: {err}"))?;
            Some(webpki)
        } else {
            None
        };
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient { provider, chain }))
            .with_no_client_auth()
    };
    Ok(MakeRustlsConnect::new(config))
}

/// libpq's modes short of `verify-full`: `prefer`/`require` encrypt without
/// authenticating the server (`chain` is `None`); `verify-ca` checks that the
/// chain leads to a trusted root but not the name (webpki checks the chain
/// before the name, so a name error means the chain held). The handshake's
/// signatures are checked in every mode.
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

/// The trait's check of each TLS version's handshake signature, done by
/// rustls's function of the same name with the provider's algorithms.
macro_rules! handshake_signature_checks {
    ($($check:ident),*) => {$(
        fn $check(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.provider.signature_verification_algorithms;
            rustls::crypto::$check(message, cert, dss, algorithms)
        }
    )*};
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    handshake_signature_checks!(verify_tls12_signature, verify_tls13_signature);

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_libpq_mode_parses_and_maps() {
        for (text, mode, applied) in [
            ("disable", SslMode::Disable, "disable"),
            ("allow", SslMode::Allow, "prefer"),
            ("prefer", SslMode::Prefer, "prefer"),
            ("require", SslMode::Require, "require"),
            ("verify-ca", SslMode::VerifyCa, "require"),
            ("verify-full", SslMode::VerifyFull, "require"),
        ] {
            let parsed: SslMode = text.parse().expect(text);
            assert_eq!((parsed, parsed.tokio_postgres_name()), (mode, applied));
        }
        assert!("verify".parse::<SslMode>().is_err());
    }

    #[test]
    fn verifying_modes_need_a_root_certificate() {
        let Err(err) = connector(SslMode::VerifyFull, None, None) else {
            panic!("verify-full without roots was accepted");
        };
        assert!(err.contains("sslrootcert"), "{err}");
        let Err(err) = connector(SslMode::VerifyCa, Some("/nonexistent.pem"), None) else {
            panic!("a missing root file was accepted");
        };
        assert!(err.contains("/nonexistent.pem"), "{err}");
        // Encrypting without verification needs nothing.
        assert!(connector(SslMode::Require, None, None).is_ok());
        assert!(connector(SslMode::Prefer, None, None).is_ok());
    }
}
