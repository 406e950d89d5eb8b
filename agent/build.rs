//! Names the families of stores this build has, from its backend features,
//! so that the sources say `cfg(object_store)` rather than repeating which
//! features make one.

/// The object stores, which share the compare-and-swap engine.
const OBJECT_STORES: &[&str] = &["s3", "azure", "gcs"];
/// The other network stores.
const DATABASES: &[&str] = &["postgres", "etcd"];

fn main() {
    let built = |feature: &&str| {
        std::env::var_os(format!("CARGO_FEATURE_{}", feature.to_uppercase())).is_some()
    };
    let object_store = OBJECT_STORES.iter().any(built);
    let network_store = object_store || DATABASES.iter().any(built);
    for (name, on) in [
        ("object_store", object_store),
        ("network_store", network_store),
    ] {
        println!("cargo::rustc-check-cfg=cfg({name})");
        if on {
            println!("cargo::rustc-cfg={name}");
        }
    }
}
