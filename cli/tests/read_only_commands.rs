//! Read commands only read (issue 66, item 2): `stats`, `list`, `show`, `health` and `config
//! show` never migrate the file, create no file beside it and change no byte of it; on a
//! file of an older release they exit 2 naming the command that migrates. Migrating is
//! explicit: `outbox migrate` (or `init`); no other command, the relay included, migrates.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

fn outbox(db: &Path, args: &[&str]) -> Output {
    common::outbox_cli(db, args)
}

/// The files in `dir`, by name, with their bytes (but for SQLite's `-shm` index, whose read
/// marks any reader moves: only its presence).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let shm = path.to_string_lossy().ends_with("-shm");
            let bytes = if shm {
                Vec::new()
            } else {
                std::fs::read(&path).unwrap()
            };
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

const READ_COMMANDS: &[&[&str]] = &[
    &["stats"],
    &["stats", "--json"],
    &["list"],
    &["list", "--json"],
    &["show", "01a22a94-1242-7542-ab2e-60c4687898df"],
    &["health"],
    &["config", "show"],
];

#[test]
fn read_commands_leave_a_file_of_release_0_1_byte_identical_and_name_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/outbox-0.1-v13.db"),
        &db,
    )
    .unwrap();
    let before = snapshot(dir.path());
    for args in READ_COMMANDS {
        let out = outbox(&db, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("schema version 13") && stderr.contains("migrate"),
            "{args:?}: {stderr}"
        );
    }
    // Nor does any command that writes migrate it: the relay included.
    let relay = outbox(
        &db,
        &[
            "relay",
            "--url",
            "http://127.0.0.1:9/events",
            "--until-empty",
        ],
    );
    assert_eq!(relay.status.code(), Some(2));
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a byte changed or a file was created"
    );

    // `migrate` says what it did, once.
    let out = outbox(&db, &["migrate"]);
    assert_eq!(out.status.code(), Some(0));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("from schema version 13 to"), "{said}");
    let again = outbox(&db, &["migrate"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("already"));

    // On a current file the read commands read, and still change nothing.
    let before = snapshot(dir.path());
    for args in READ_COMMANDS {
        let out = outbox(&db, args);
        assert_ne!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stats = outbox(&db, &["stats", "--json"]);
    assert_eq!(stats.status.code(), Some(0));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert!(stats["pending"].as_i64().is_some(), "{stats}");
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a byte changed or a file was created"
    );
}
