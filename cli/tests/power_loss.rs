//! Power loss with real processes: an app committing business rows and their events (some
//! rolled back on purpose) and a relay delivering them to a receiver on loopback both run on
//! the power-cut file system, which loses the power at a random moment, again and again.
//! After every cut and reboot:
//! - the file passes `PRAGMA integrity_check`;
//! - under `synchronous=FULL` every commit whose call returned is there;
//! - under `NORMAL` a lost transaction lost its business row and its event together;
//! - in both modes the receiver holds no event the device does not hold (no ghost), thanks
//!   to the relay's durability barrier;
//! - and at the end every event on the device is delivered once the relay runs again.
//!
//! `POWER_CUTS` sets the cuts per mode (default 50; the soak is `POWER_CUTS=1000 cargo test
//! --release --test power_loss -- --nocapture`).
#![cfg(target_os = "linux")]

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/power_cut_fs.rs"]
mod power_cut_fs;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{example_binary, TestReceiver};
use power_cut_fs::{Cut, Mounted};
use sqlite_outbox::rusqlite::Connection;

fn cuts() -> usize {
    std::env::var("POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

fn spawn_app(writer: &Path, db: &Path, first_seq: i64, synchronous: &str) -> Child {
    Command::new(writer)
        .arg(db)
        .arg(first_seq.to_string())
        // Paced, so that a cut lands mid-stream.
        .args(["100000", "500"])
        .env("OUTBOX_SYNCHRONOUS", synchronous)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn app")
}

fn spawn_relay(db: &Path, url: &str, synchronous: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--db")
        .arg(db)
        .args(["--synchronous", synchronous])
        .args(["relay", "--url", url, "--lease-secs", "2", "--workers", "2"])
        .args(extra)
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn relay")
}

/// The event ids the app printed: each only after its commit returned.
fn confirmed_ids(app: Child) -> Vec<String> {
    let out = app.wait_with_output().expect("app output");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| Some(l.split(' ').next()?.to_string()))
        .collect()
}

/// What a rebooted device holds.
struct Device {
    /// Event id → the `seq` of the transaction that committed it.
    events: HashMap<String, i64>,
    /// Business rows: event id → seq.
    orders: HashMap<String, i64>,
}

fn read_device(db: &Path) -> Device {
    let conn = Connection::open(db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "the file is corrupt after a power cut");
    let pairs = |sql: &str| -> HashMap<String, i64> {
        conn.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    // Under NORMAL a cut early in the run may take the app's own `CREATE TABLE` with it,
    // like any transaction not yet synced: then there are no orders (and, whole
    // transactions lost, no events of the app's either, which the caller checks).
    let has_orders: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'orders')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    Device {
        events: pairs("SELECT event_id, json_extract(payload, '$.seq') FROM outbox_events"),
        orders: if has_orders {
            pairs("SELECT event_id, seq FROM orders")
        } else {
            HashMap::new()
        },
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    disk: PathBuf,
    mnt: PathBuf,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&disk).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        Rig {
            _dir: dir,
            disk,
            mnt,
        }
    }

    fn mount(&self) -> Mounted {
        Mounted::mount(&self.disk, &self.mnt).expect("mount the power-cut file system")
    }

    /// The database as the processes see it, through the mount.
    fn db(&self) -> PathBuf {
        self.mnt.join("app.db")
    }

    /// The database as the disk holds it, read with the file system unmounted. The test
    /// process never opens SQLite through the mount: it serves the mount itself, and a page
    /// fault on SQLite's shared `-shm` mapping, taken under the process's memory-map lock,
    /// would wait for a server thread that needs that lock to allocate.
    fn disk_db(&self) -> PathBuf {
        self.disk.join("app.db")
    }
}

/// What a run of cuts came to.
#[derive(Debug, Default)]
struct Tally {
    cuts: usize,
    confirmed: usize,
    lost: usize,
    delivered: usize,
    duplicates: usize,
}

fn power_cuts(synchronous: &str) -> Tally {
    let writer = example_binary("crash_writer");
    let rig = Rig::new();
    let receiver = TestReceiver::ok();
    let url = receiver.url();
    // The app was installed before the power cuts began: its file and tables are on disk.
    let fs = rig.mount();
    let mut init = spawn_app(&writer, &rig.db(), 0, synchronous);
    std::thread::sleep(Duration::from_millis(300));
    init.kill().unwrap();
    confirmed_ids(init);
    fs.unmount().unwrap();
    Connection::open(rig.disk_db())
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let mut tally = Tally::default();
    for cut in 0..cuts() {
        let fs = rig.mount();
        let first_seq = (cut as i64 + 1) * 1_000_000;
        let app = spawn_app(&writer, &rig.db(), first_seq, synchronous);
        let mut relay = spawn_relay(&rig.db(), &url, synchronous, &[]);
        std::thread::sleep(Duration::from_millis(fastrand::u64(50..500)));
        let how = if cut % 2 == 0 {
            Cut::DropUnsynced
        } else {
            Cut::TornPrefix {
                seed: fastrand::u64(..),
            }
        };
        fs.cut(how).unwrap();
        // The power is gone for the processes too.
        let mut app = app;
        app.kill().unwrap();
        relay.kill().unwrap();
        relay.wait().unwrap();
        let confirmed = confirmed_ids(app);
        fs.unmount().unwrap();

        // The reboot: the disk as the cut left it.
        let device = read_device(&rig.disk_db());
        tally.cuts += 1;
        tally.confirmed += confirmed.len();
        let missing: Vec<&String> = confirmed
            .iter()
            .filter(|id| !device.events.contains_key(*id))
            .collect();
        tally.lost += missing.len();
        if synchronous == "full" {
            assert!(
                missing.is_empty(),
                "cut {cut} ({how:?}): {} commits returned under FULL and were lost",
                missing.len()
            );
        }
        // Business row and event: both or neither.
        let events: HashSet<&String> = device.events.keys().collect();
        let orders: HashSet<&String> = device.orders.keys().collect();
        assert_eq!(
            events, orders,
            "cut {cut} ({how:?}): an event without its business row, or the reverse"
        );
        assert!(
            device.events.values().all(|seq| seq % 7 != 0),
            "a rolled-back transaction's event is on the device"
        );
        // No ghost: the receiver holds nothing the device does not.
        for id in receiver.event_ids() {
            assert!(
                device.events.contains_key(&id),
                "cut {cut} ({how:?}): ghost event {id} was delivered but is not on the device"
            );
        }
    }

    // The last reboot: the relay drains everything on the device.
    // Five keys, one event in flight per key: allow a second per 100 events, at least 2 min.
    let backlog = read_device(&rig.disk_db()).events.len();
    let fs = rig.mount();
    let timeout = format!("{}s", 120 + backlog / 100);
    let mut drain = spawn_relay(
        &rig.db(),
        &url,
        synchronous,
        &["--until-empty", "--timeout", &timeout],
    );
    let status = drain.wait().unwrap();
    assert!(status.success(), "the final drain did not empty the outbox");
    fs.unmount().unwrap();
    let device = read_device(&rig.disk_db());
    let mut received: HashMap<String, usize> = HashMap::new();
    for id in receiver.event_ids() {
        *received.entry(id).or_default() += 1;
    }
    for id in device.events.keys() {
        assert!(received.contains_key(id), "event {id} was never delivered");
    }
    for id in received.keys() {
        assert!(device.events.contains_key(id), "ghost event {id}");
    }
    tally.delivered = received.len();
    tally.duplicates = received.values().map(|n| n - 1).sum();
    tally
}

#[test]
fn power_cuts_under_normal_lose_whole_transactions_and_deliver_no_ghost() {
    let tally = power_cuts("normal");
    eprintln!("synchronous=NORMAL: {tally:?}");
    assert_eq!(tally.cuts, cuts());
    assert!(tally.delivered > 0);
}

#[test]
fn power_cuts_under_full_lose_no_returned_commit_and_deliver_no_ghost() {
    let tally = power_cuts("full");
    eprintln!("synchronous=FULL: {tally:?}");
    assert_eq!(tally.lost, 0);
    assert!(tally.delivered > 0);
}
