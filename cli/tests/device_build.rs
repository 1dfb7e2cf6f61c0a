//! A device build (issue 66, item 7): `cargo install --path cli --no-default-features`
//! gives the relay over HTTP, enqueue, the admin commands and bundles, without tokio, hyper
//! or the PostgreSQL client (`ingest` and `fleet` come with the default `ingest` feature,
//! MQTT with `mqtt`). Read from the dependency tree Cargo resolves for that build.

use std::process::Command;

fn normal_dependencies(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "-p",
            "outbox-cli",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(features)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut crates: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    crates.sort();
    crates.dedup();
    crates
}

#[test]
fn the_device_build_has_no_tokio_hyper_or_postgres_and_the_default_build_has_them() {
    let device = normal_dependencies(&["--no-default-features"]);
    for heavy in ["tokio", "hyper", "postgres", "tokio-postgres", "rumqttc"] {
        assert!(
            !device.iter().any(|c| c == heavy),
            "{heavy} in the device build: {device:?}"
        );
    }
    assert!(device.iter().any(|c| c == "ureq"), "{device:?}");
    let full = normal_dependencies(&[]);
    for heavy in ["tokio", "hyper", "postgres", "rumqttc"] {
        assert!(
            full.iter().any(|c| c == heavy),
            "{heavy} missing by default"
        );
    }
    assert!(
        device.len() < full.len(),
        "{} crates against {}",
        device.len(),
        full.len()
    );
}
