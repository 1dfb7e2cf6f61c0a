//! A database opened through a symbolic link on another file system (issue 67, item 6): a
//! data disk mounted somewhere and the app's file reached through a link in its own folder.
//! The reserve, the free-space reads and the WAL watch must be on the file system that holds
//! the file, as SQLite's `-wal` and `-shm` are. Before: `stats` read the link's file system
//! (a full data disk said 73 GiB free), two paths made two reserves, and another process's
//! commits reached the relay only at its poll (the watch of the link's folder never fired).
#![cfg(all(target_os = "linux", feature = "wal-watch"))]

mod common;
#[path = "common/small_disk.rs"]
mod small_disk;

use std::time::Duration;

use common::{wait_until, TestReceiver};
use small_disk::SmallDisk;
use sqlite_outbox::Outbox;

#[test]
fn a_file_reached_through_a_link_keeps_its_reserve_room_and_watch_on_the_disk_that_holds_it() {
    let disk = SmallDisk::mount(16);
    let real = disk.path().join("app.db");
    let home = tempfile::tempdir().unwrap();
    let link = home.path().join("app.db");
    // The app's folder holds a link to the file on the data disk (created there first).
    drop(Outbox::open(&real).unwrap());
    std::os::unix::fs::symlink(&real, &link).unwrap();

    let outbox = Outbox::open(&link).unwrap();
    assert_eq!(outbox.path(), real.canonicalize().unwrap());
    // One reserve, beside the file, whichever path opened it.
    let second = Outbox::open(&link).unwrap();
    drop(second);
    assert!(disk.path().join("app.db-outbox-reserve").exists());
    assert!(!home.path().join("app.db-outbox-reserve").exists());
    // Free space is the data disk's (16 MiB), and a full data disk is said to be full.
    let free = outbox.stats().unwrap().disk_free_bytes.unwrap();
    assert!(free <= 16 << 20, "{free} bytes free on a 16 MiB disk");
    let filler = disk.fill("camera.bin");
    let stats = outbox.stats().unwrap();
    assert!(stats.disk_full, "{stats:?}");
    std::fs::remove_file(filler).unwrap();

    // Another process's commit, made through the link, wakes a relay whose poll is a
    // minute: the watch is on the folder that holds the WAL.
    let receiver = TestReceiver::ok();
    let relay = outbox
        .relay(common::minute_poll(&receiver))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    common::insert_from_python(&link, "from.python", "{\"n\": 1}");
    let woke = wait_until(Duration::from_secs(10), || receiver.event_count() == 1);
    let _ = relay.shutdown();
    assert!(
        woke,
        "a commit through the link not delivered within 10 s (the poll is 60 s)"
    );
}
