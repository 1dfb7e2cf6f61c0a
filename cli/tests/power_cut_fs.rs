//! The power-cut file system the power-loss tests run on behaves as a disk would: a synced
//! write survives a cut, an unsynced one does not, names change at once, and nothing works
//! between the cut and the reboot.
#![cfg(target_os = "linux")]

#[path = "../../tests/common/power_cut_fs.rs"]
mod power_cut_fs;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use power_cut_fs::{Cut, Mounted};

struct Rig {
    _dir: tempfile::TempDir,
    disk: std::path::PathBuf,
    mnt: std::path::PathBuf,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&disk).unwrap();
    fs::create_dir(&mnt).unwrap();
    Rig {
        _dir: dir,
        disk,
        mnt,
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> File {
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
    f
}

#[test]
fn a_synced_write_survives_a_cut_and_an_unsynced_one_does_not() {
    let r = rig();
    let fs = Mounted::mount(&r.disk, &r.mnt).unwrap();
    let mut synced = write_file(&r.mnt.join("synced"), b"kept");
    synced.sync_all().unwrap();
    synced.write_all(b" and lost").unwrap();
    let datasynced = write_file(&r.mnt.join("datasynced"), b"kept too");
    datasynced.sync_data().unwrap();
    write_file(&r.mnt.join("never-synced"), b"lost");
    // Before the cut, readers see every write.
    assert_eq!(fs::read(r.mnt.join("synced")).unwrap(), b"kept and lost");
    fs.cut(Cut::DropUnsynced).unwrap();
    // Between the cut and the reboot, nothing works.
    assert!(synced.write_all(b"more").is_err());
    assert!(fs::read(r.mnt.join("synced")).is_err());
    drop((synced, datasynced));
    fs.unmount().unwrap();

    // The reboot: the disk as it was left.
    let fs = Mounted::mount(&r.disk, &r.mnt).unwrap();
    assert_eq!(fs::read(r.mnt.join("synced")).unwrap(), b"kept");
    assert_eq!(fs::read(r.mnt.join("datasynced")).unwrap(), b"kept too");
    // The name was journaled, its data never reached the disk.
    assert_eq!(fs::read(r.mnt.join("never-synced")).unwrap(), b"");
    fs.unmount().unwrap();
}

#[test]
fn renames_and_unlinks_are_kept_and_a_truncate_waits_for_the_sync() {
    let r = rig();
    let fs = Mounted::mount(&r.disk, &r.mnt).unwrap();
    write_file(&r.mnt.join("a"), b"renamed").sync_all().unwrap();
    fs::rename(r.mnt.join("a"), r.mnt.join("b")).unwrap();
    write_file(&r.mnt.join("gone"), b"x").sync_all().unwrap();
    fs::remove_file(r.mnt.join("gone")).unwrap();
    let cut_short = write_file(&r.mnt.join("cut-short"), b"0123456789");
    cut_short.sync_all().unwrap();
    cut_short.set_len(3).unwrap();
    fs.cut(Cut::DropUnsynced).unwrap();
    drop(cut_short);
    fs.unmount().unwrap();

    let fs = Mounted::mount(&r.disk, &r.mnt).unwrap();
    let mut names: Vec<_> = fs::read_dir(&r.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "cut-short"]);
    assert_eq!(fs::read(r.mnt.join("b")).unwrap(), b"renamed");
    assert_eq!(fs::read(r.mnt.join("cut-short")).unwrap(), b"0123456789");
    fs.unmount().unwrap();
}

#[test]
fn a_torn_cut_keeps_an_ordered_prefix_of_the_unsynced_writes() {
    let chunks: Vec<Vec<u8>> = (0..6u8).map(|i| vec![b'a' + i; 1500]).collect();
    let mut outcomes = std::collections::HashSet::new();
    for seed in 0..40 {
        let r = rig();
        let fs = Mounted::mount(&r.disk, &r.mnt).unwrap();
        let f = write_file(&r.mnt.join("log"), b"");
        f.sync_all().unwrap();
        for (i, chunk) in chunks.iter().enumerate() {
            f.write_all_at(chunk, (i * 1500) as u64).unwrap();
        }
        fs.cut(Cut::TornPrefix { seed }).unwrap();
        drop(f);
        fs.unmount().unwrap();
        let on_disk = fs::read(r.disk.join("log")).unwrap();
        // Whatever survived is the writes' concatenation cut at some point.
        let all: Vec<u8> = chunks.concat();
        assert_eq!(on_disk[..], all[..on_disk.len()], "seed {seed}");
        outcomes.insert(on_disk.len());
    }
    assert!(outcomes.len() > 5, "the cut point varies: {outcomes:?}");
}

/// SQLite runs on the layer from other processes (the test process serves the mount, so it
/// never maps SQLite's `-shm` through it itself: a fault on that mapping would wait for a
/// server thread of the same process that needs the faulting thread's memory-map lock).
#[test]
fn sqlite_in_wal_mode_keeps_every_full_commit_of_two_processes_across_a_cut() {
    use sqlite_outbox::rusqlite::Connection;
    let r = rig();
    let fs = Mounted::mount(&r.disk, &r.mnt).unwrap();
    let db = r.mnt.join("app.db");
    let outbox = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["--synchronous", "full", "--db"])
            .arg(&db)
            .args(args)
            .env_remove("OUTBOX_SYNCHRONOUS")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    assert!(outbox(&["init"]).wait().unwrap().success());
    // Two processes commit 100 events each, one transaction per line, side by side.
    let lines: String = (0..100)
        .map(|i| format!("{{\"type\":\"t\",\"data\":{{\"n\":{i}}}}}\n"))
        .collect();
    let writers: Vec<_> = (0..2)
        .map(|_| {
            let mut child = outbox(&["enqueue", "--jsonl"]);
            child
                .stdin
                .take()
                .unwrap()
                .write_all(lines.as_bytes())
                .unwrap();
            child
        })
        .collect();
    let mut committed = 0;
    for child in writers {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        committed += String::from_utf8_lossy(&out.stdout).lines().count();
    }
    assert_eq!(committed, 200);
    assert!(fs.syncs() >= 200, "FULL syncs every commit: {}", fs.syncs());
    fs.cut(Cut::DropUnsynced).unwrap();
    fs.unmount().unwrap();

    // The disk after the reboot, opened directly.
    let conn = Connection::open(r.disk.join("app.db")).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let count: i64 = conn
        .query_row("SELECT COUNT(*) FROM outbox_events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 200, "every FULL commit survives");
}
