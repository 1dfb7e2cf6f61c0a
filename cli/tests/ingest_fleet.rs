//! The fleet picture end to end with real parts: four device outboxes relay through a
//! round-robin TCP load balancer to three `outbox ingest` processes, which store into one
//! PostgreSQL; meanwhile ingest processes are killed with SIGKILL and restarted, so devices
//! move from process to process mid-run. Every committed event must be stored exactly once
//! (none lost, none twice, none rolled back), and each key's events must read back in
//! `sequence` order through `outbox_key_events`.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/postgres.rs"]
mod pg;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::rows;
use pg::Postgres;
use serde_json::json;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One `outbox ingest` process on a fixed port, restartable.
struct Ingest {
    port: u16,
    postgres_file: std::path::PathBuf,
    child: Option<Child>,
}

impl Ingest {
    fn start(port: u16, postgres_file: std::path::PathBuf) -> Ingest {
        let mut ingest = Ingest {
            port,
            postgres_file,
            child: None,
        };
        ingest.restart();
        ingest
    }

    fn restart(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["ingest", "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--postgres-file")
            .arg(&self.postgres_file)
            .args(["--threads", "4"])
            .env("OUTBOX_SECRET", SECRET)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start outbox ingest");
        // It prints one line once it listens.
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert!(
            line.starts_with("listening on http://127.0.0.1:"),
            "{line:?}"
        );
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP load balancer: each connection goes to the next backend that accepts it.
struct Balancer {
    port: u16,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Balancer {
    fn start(backends: Vec<u16>) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let next = AtomicUsize::new(0);
        let accept = std::thread::Builder::new()
            .name("test-balancer".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    let client = match listener.accept() {
                        Ok((client, _)) => client,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                    };
                    let _ = client.set_nonblocking(false);
                    let start = next.fetch_add(1, Ordering::Relaxed);
                    let backend = (0..backends.len()).find_map(|i| {
                        let port = backends[(start + i) % backends.len()];
                        TcpStream::connect(("127.0.0.1", port)).ok()
                    });
                    match backend {
                        Some(backend) => pipe(client, backend),
                        None => drop(client),
                    }
                }
            })
            .unwrap();
        Balancer {
            port,
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Copies bytes both ways until either side closes; a killed backend closes the client.
fn pipe(client: TcpStream, backend: TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = backend.set_nodelay(true);
    let (Ok(client2), Ok(backend2)) = (client.try_clone(), backend.try_clone()) else {
        return;
    };
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        move || {
            let mut buf = [0u8; 16 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        }
    };
    let _ = std::thread::Builder::new()
        .name("test-balancer-up".into())
        .spawn(copy(client, backend));
    let _ = std::thread::Builder::new()
        .name("test-balancer-down".into())
        .spawn(copy(backend2, client2));
}

/// Commits `n` keyed events in transactions of ten, every third rolled back; the ids of the
/// committed ones.
fn commit_events(device: &Outbox, n: usize) -> Vec<String> {
    let mut committed = Vec::new();
    for (t, chunk) in (0..n).collect::<Vec<_>>().chunks(10).enumerate() {
        let mut ids = Vec::new();
        let result: Result<(), sqlite_outbox::Error> = device.transaction(|tx| {
            for &i in chunk {
                let e = device.enqueue(
                    tx,
                    Event::new("reading.taken", json!({"i": i}))
                        .partition_key(format!("k{}", i % 3)),
                )?;
                ids.push(e.event_id().to_string());
            }
            if t % 3 == 2 {
                return Err(sqlite_outbox::Error::InvalidConfig("rolled back".into()));
            }
            Ok(())
        });
        if result.is_ok() {
            committed.extend(ids);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    committed
}

#[test]
fn three_ingest_processes_killed_mid_run_store_every_committed_event_exactly_once() {
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let postgres_file = dir.path().join("postgres-url");
    std::fs::write(&postgres_file, format!("{}\n", postgres.url())).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| common::closed_port()).collect();
    let mut ingests: Vec<Ingest> = ports
        .iter()
        .map(|&p| Ingest::start(p, postgres_file.clone()))
        .collect();
    let balancer = Balancer::start(ports.clone());
    let url = format!("http://127.0.0.1:{}/events", balancer.port);

    let devices: Vec<Outbox> = (0..4)
        .map(|d| {
            Outbox::builder()
                .default_source(format!("/devices/{d}"))
                .open(dir.path().join(format!("device-{d}.db")))
                .unwrap()
        })
        .collect();
    let relays: Vec<_> = devices
        .iter()
        .enumerate()
        .map(|(d, device)| {
            let mut destination = Destination::http("default", &url).secret(SECRET);
            if d % 2 == 0 {
                destination = destination.batch(20, 1 << 20);
            }
            device
                .relay(
                    RelayConfig::new()
                        .destination(destination)
                        .poll_interval(Duration::from_millis(20)),
                )
                .start()
                .unwrap()
        })
        .collect();
    let writers: Vec<_> = devices
        .iter()
        .map(|device| {
            let device = device.clone();
            std::thread::spawn(move || commit_events(&device, 1500))
        })
        .collect();
    // Kill one process at a time while the devices commit and deliver.
    let mut kills = 0;
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(400));
        let victim = &mut ingests[round % 3];
        victim.kill();
        kills += 1;
        std::thread::sleep(Duration::from_millis(200));
        victim.restart();
    }
    let committed: Vec<Vec<String>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    for device in &devices {
        assert!(
            common::all_delivered_within(device, Duration::from_secs(120)),
            "a device did not deliver everything"
        );
    }
    for relay in relays {
        let _ = relay.shutdown();
    }

    let mut client = postgres.client();
    let all: HashSet<(String, String)> = committed
        .iter()
        .enumerate()
        .flat_map(|(d, ids)| {
            ids.iter()
                .map(move |id| (format!("/devices/{d}"), id.clone()))
        })
        .collect();
    let stored_rows = client
        .query("SELECT source, id FROM outbox_ingested", &[])
        .unwrap();
    let stored: Vec<(String, String)> = stored_rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let distinct: HashSet<(String, String)> = stored.iter().cloned().collect();
    let duplicates = stored.len() - distinct.len();
    let lost = all.difference(&distinct).count();
    let ghosts = distinct.difference(&all).count();
    let retried: i64 = devices.iter().flat_map(rows).map(|r| r.attempts - 1).sum();
    eprintln!(
        "fleet: {kills} kills, {} committed, {} stored, {duplicates} duplicates stored, {lost} \
         lost, {ghosts} rolled back but stored; {retried} deliveries retried",
        all.len(),
        stored.len()
    );
    assert_eq!(duplicates, 0);
    assert_eq!(lost, 0);
    assert_eq!(ghosts, 0);
    assert_eq!(stored.len(), all.len());
    // Per key, in the device's commit order.
    for (d, device) in devices.iter().enumerate() {
        let source = format!("/devices/{d}");
        for k in 0..3 {
            let key = format!("k{k}");
            let read: Vec<String> = client
                .query("SELECT id FROM outbox_key_events($1, $2)", &[&source, &key])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let conn = device.connection().unwrap();
            let mut stmt = conn
                .prepare("SELECT event_id FROM outbox_events WHERE partition_key = ?1 ORDER BY id")
                .unwrap();
            let expected: Vec<String> = stmt
                .query_map([&key], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(read, expected, "{source} {key}");
        }
    }
    drop(balancer);
}
