//! `cargo run -p runlock-tests --example test_ca -- DIR`: a throwaway CA
//! (ca.crt, ca.key) and what it signs, made with rcgen for the emulator
//! scripts' TLS servers: a server certificate for 127.0.0.1 and localhost
//! (server.crt, server.key) and a client certificate (client.crt,
//! client.key). Keys are written 0600, as PostgreSQL requires of its own.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

fn main() -> Result<()> {
    let dir = std::env::args_os().nth(1).context("usage: test_ca DIR")?;
    let dir = Path::new(&dir);

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "runlock-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key)?;
    write(dir, "ca", &ca, &ca_key)?;

    let mut server = CertificateParams::new(["localhost".to_string()])?;
    server
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    signed(dir, "server", server, &ca, &ca_key)?;

    let mut client = CertificateParams::default();
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    signed(dir, "client", client, &ca, &ca_key)
}

/// `{dir}/{who}.crt` and `.key`: a certificate for `runlock-test-{who}` the CA signed.
fn signed(
    dir: &Path,
    who: &str,
    mut params: CertificateParams,
    ca: &Certificate,
    ca_key: &KeyPair,
) -> Result<()> {
    params
        .distinguished_name
        .push(DnType::CommonName, format!("runlock-test-{who}"));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca, ca_key)?;
    write(dir, who, &cert, &key)
}

fn write(dir: &Path, name: &str, cert: &Certificate, key: &KeyPair) -> Result<()> {
    let crt = dir.join(format!("{name}.crt"));
    std::fs::write(&crt, cert.pem()).with_context(|| format!("writing {}", crt.display()))?;
    let path = dir.join(format!("{name}.key"));
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut file, key.serialize_pem().as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}
