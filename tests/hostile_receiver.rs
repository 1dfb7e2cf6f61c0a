//! A hostile receiver on 127.0.0.1 that, at random and in bursts, answers 500, 503 or 429
//! with `Retry-After`, hangs past the timeout, drops the connection mid-request or
//! mid-response, sends an endless body, answers slowly, or stops listening for a while.
//! Nothing may be lost, nothing dead-lettered because of outages, per-key order must hold
//! and `Retry-After` must be honoured.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::wait_until;
use serde_json::json;
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Event, Outbox, RelayConfig};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mood {
    Fine,
    Error500,
    Busy503,
    Throttle429,
    Hang,
    DropMidRequest,
    DropMidResponse,
    EndlessBody,
    Slow,
}

const MOODS: [Mood; 9] = [
    Mood::Fine,
    Mood::Error500,
    Mood::Busy503,
    Mood::Throttle429,
    Mood::Hang,
    Mood::DropMidRequest,
    Mood::DropMidResponse,
    Mood::EndlessBody,
    Mood::Slow,
];

#[derive(Default)]
struct Log {
    /// (event id, partition key, sequence) of every 2xx, in order.
    accepted: Vec<(String, String, i64)>,
    /// When each event id was last told to come back after a delay, and the delay.
    told_to_wait: HashMap<String, (Instant, Duration)>,
    /// Retries that came back before the `Retry-After` they were given.
    too_early: Vec<String>,
    /// Requests met by each mood.
    moods: HashMap<String, usize>,
}

struct Hostile {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    requests: Arc<AtomicUsize>,
    thread: Option<thread::JoinHandle<()>>,
    port: u16,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut length = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}

fn serve(
    stream: TcpStream,
    mood: Arc<Mutex<Mood>>,
    log: Arc<Mutex<Log>>,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    while !stop.load(Ordering::Relaxed) {
        if *mood.lock().unwrap() == Mood::DropMidRequest {
            // Read only part of the request, then hang up.
            let mut partial = [0u8; 16];
            if reader.read(&mut partial).unwrap_or(0) > 0 {
                *log.lock()
                    .unwrap()
                    .moods
                    .entry("DropMidRequest".into())
                    .or_default() += 1;
            }
            return;
        }
        let Some(body) = read_request(&mut reader) else {
            return;
        };
        // The mood of the moment the request arrived.
        let current = match *mood.lock().unwrap() {
            Mood::DropMidRequest => Mood::DropMidResponse,
            m => m,
        };
        *log.lock()
            .unwrap()
            .moods
            .entry(format!("{current:?}"))
            .or_default() += 1;
        requests.fetch_add(1, Ordering::Relaxed);
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let id = event["id"].as_str().unwrap_or_default().to_string();
        let now = Instant::now();
        {
            let mut log = log.lock().unwrap();
            if let Some((at, wait)) = log.told_to_wait.remove(&id) {
                // The relay keeps time in whole milliseconds: allow that much rounding.
                if now + Duration::from_millis(5) < at + wait {
                    log.too_early.push(id.clone());
                }
            }
        }
        let reply: &[u8] = match current {
            Mood::Fine | Mood::Slow => {
                if current == Mood::Slow {
                    thread::sleep(Duration::from_millis(100));
                }
                let key = event["partitionkey"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let seq = event["data"]["seq"].as_i64().unwrap_or(-1);
                // The relay's accounting of its streams is not an event.
                if event["type"] != sqlite_outbox::wire::ACCOUNTING_TYPE {
                    log.lock().unwrap().accepted.push((id, key, seq));
                }
                b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"
            }
            Mood::Error500 => {
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\noops"
            }
            Mood::Busy503 | Mood::Throttle429 => {
                log.lock()
                    .unwrap()
                    .told_to_wait
                    .insert(id, (now, Duration::from_secs(1)));
                if current == Mood::Busy503 {
                    b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n"
                } else {
                    b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n"
                }
            }
            Mood::Hang => {
                // Past the relay's 1 s request timeout, then gone.
                thread::sleep(Duration::from_millis(1500));
                return;
            }
            Mood::DropMidResponse => {
                let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-le");
                return;
            }
            Mood::EndlessBody => {
                // A 200 whose body never ends: the relay reads a bounded amount and moves on.
                let key = event["partitionkey"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let seq = event["data"]["seq"].as_i64().unwrap_or(-1);
                // The relay's accounting of its streams is not an event.
                if event["type"] != sqlite_outbox::wire::ACCOUNTING_TYPE {
                    log.lock().unwrap().accepted.push((id, key, seq));
                }
                if writer
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n")
                    .is_err()
                {
                    return;
                }
                let chunk = [b'x'; 16 * 1024];
                let until = Instant::now() + Duration::from_secs(2);
                while Instant::now() < until && writer.write_all(&chunk).is_ok() {}
                return;
            }
            Mood::DropMidRequest => unreachable!(),
        };
        if writer.write_all(reply).is_err() {
            return;
        }
    }
}

impl Hostile {
    fn start(seconds_of_chaos: u64) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Log::default()));
        let requests = Arc::new(AtomicUsize::new(0));
        let mood = Arc::new(Mutex::new(Mood::Fine));
        let thread = {
            let (stop, log, requests) = (stop.clone(), log.clone(), requests.clone());
            thread::Builder::new()
                .name("hostile-receiver".into())
                .spawn(move || {
                    let chaos_until = Instant::now() + Duration::from_secs(seconds_of_chaos);
                    let mut listener = Some(listener);
                    let mut next_switch = Instant::now();
                    let mut offline_until: Option<Instant> = None;
                    // Each hostile mood in turn (in random order), a calm spell between two,
                    // and once a round no listener at all: every kind meets traffic.
                    let mut round: Vec<Mood> = Vec::new();
                    let mut calm = true;
                    let mut offline_done = false;
                    let mut offline_at: Option<Instant> = None;
                    while !stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        if now >= next_switch {
                            calm = !calm;
                            // Calm spells outlast the 1 s pause a 429 or 503 asks for, so the
                            // next hostile spell meets traffic again.
                            next_switch = now
                                + Duration::from_millis(if calm {
                                    1_200
                                } else {
                                    fastrand::u64(400..600)
                                });
                            let pick = if now >= chaos_until || calm {
                                Mood::Fine
                            } else {
                                if round.is_empty() && !offline_done {
                                    round = MOODS[1..].to_vec();
                                    fastrand::shuffle(&mut round);
                                }
                                let pick = round.pop().unwrap_or(Mood::Fine);
                                if round.is_empty() && !offline_done {
                                    // After the last mood, no listener at all for a while.
                                    offline_done = true;
                                    offline_at = Some(next_switch);
                                }
                                pick
                            };
                            *mood.lock().unwrap() = pick;
                        }
                        if offline_at.is_some_and(|t| now >= t) {
                            offline_at = None;
                            listener = None;
                            offline_until = Some(now + Duration::from_millis(1500));
                        }
                        if offline_until.is_some_and(|t| now >= t) {
                            offline_until = None;
                            listener =
                                Some(TcpListener::bind(("127.0.0.1", port)).expect("rebind"));
                        }
                        let Some(l) = &listener else {
                            thread::sleep(Duration::from_millis(10));
                            continue;
                        };
                        l.set_nonblocking(true).unwrap();
                        match l.accept() {
                            Ok((stream, _)) => {
                                let _ = stream.set_nonblocking(false);
                                let (mood, log, requests, stop) =
                                    (mood.clone(), log.clone(), requests.clone(), stop.clone());
                                thread::spawn(move || serve(stream, mood, log, requests, stop));
                            }
                            Err(_) => thread::sleep(Duration::from_millis(2)),
                        }
                    }
                })
                .unwrap()
        };
        Hostile {
            stop,
            log,
            requests,
            thread: Some(thread),
            port,
        }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_hostile_receiver_loses_nothing_and_dead_letters_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let outbox = Outbox::open(dir.path().join("hostile.db")).unwrap();
    let hostile = Hostile::start(14);
    let n = 3_500;
    // Events keep coming through the whole stretch of chaos, so every mood meets traffic.
    let writer = {
        let outbox = outbox.clone();
        thread::Builder::new()
            .name("hostile-test-writer".into())
            .spawn(move || {
                for seq in 0..n {
                    let key = format!("k{}", seq % 10);
                    let event = Event::new("reading", json!({"seq": seq})).partition_key(key);
                    let _ = outbox.transaction(|tx| outbox.enqueue(tx, event)).unwrap();
                    thread::sleep(Duration::from_millis(4));
                }
            })
            .unwrap()
    };
    let relay = outbox
        .relay(
            RelayConfig::new()
                .destination(
                    Destination::http("default", format!("http://127.0.0.1:{}/", hostile.port))
                        .http_config(
                            HttpConfig::new()
                                .connect_timeout(Duration::from_millis(500))
                                .request_timeout(Duration::from_secs(1)),
                        ),
                )
                .workers(4)
                .lease(Duration::from_secs(3))
                .poll_interval(Duration::from_millis(20))
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(300))
                .offline_backoff(Duration::from_millis(20), Duration::from_millis(300))
                .retry_after_cap(Duration::from_secs(2))
                .max_attempts(100)
                .shutdown_timeout(Duration::from_secs(2)),
        )
        .start()
        .unwrap();
    writer.join().unwrap();
    let drained = wait_until(Duration::from_secs(120), || {
        outbox.stats().map(|s| s.pending == 0).unwrap_or(false)
    });
    let stats = relay.shutdown();
    assert!(
        drained,
        "backlog not drained: {:?}",
        outbox.stats().unwrap()
    );
    let s = outbox.stats().unwrap();
    assert_eq!(
        (s.delivered, s.dead),
        (n as i64, 0),
        "nothing lost, nothing dead"
    );

    let log = hostile.log.lock().unwrap();
    assert!(
        log.too_early.is_empty(),
        "Retry-After ignored for {:?}",
        log.too_early
    );
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut order: HashMap<&str, Vec<i64>> = HashMap::new();
    for (i, (id, key, seq)) in log.accepted.iter().enumerate() {
        if first.insert(id.as_str(), i).is_none() {
            order.entry(key.as_str()).or_default().push(*seq);
        }
    }
    assert_eq!(first.len(), n, "every event accepted at least once");
    for (key, seqs) in order {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of order"
        );
    }
    // Every kind of hostility met real traffic.
    for mood in MOODS {
        assert!(
            log.moods.get(&format!("{mood:?}")).copied().unwrap_or(0) > 0,
            "{mood:?} never happened: {:?}",
            log.moods
        );
    }
    // Bounded memory: endless bodies and hung requests must not pile up.
    let rss = peak_rss_kib();
    assert!(rss < 256 * 1024, "peak RSS {rss} KiB");
    println!(
        "hostile receiver: {} requests for {n} events ({:?}), {} duplicates accepted, peak RSS {} MiB, {stats:?}",
        hostile.requests.load(Ordering::Relaxed),
        log.moods,
        log.accepted.len() - n,
        rss / 1024
    );
}
