//! A receiver's sockets, counted: a TCP forwarder on 127.0.0.1 in front of a receiver
//! (HTTP, HTTPS, an MQTT broker), counting every byte that crosses it each way, as a
//! carrier counts a device's data. TLS passes through it untouched, so its handshakes and
//! records are counted as the network carries them.
//!
//! Include with `#[path = "common/byte_counter.rs"] mod byte_counter;`.

#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a copying thread looks whether the forwarder is stopping.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// A forwarder to one address, counting bytes each way.
pub struct ByteCounter {
    pub port: u16,
    /// Bytes from the clients to the receiver.
    up: Arc<AtomicU64>,
    /// Bytes from the receiver to the clients.
    down: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    stopping: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl ByteCounter {
    /// Forwards connections on a free loopback port to `target`.
    pub fn start(target: SocketAddr) -> ByteCounter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicU64::new(0));
        let down = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let acceptor = {
            let (up, down, connections, stopping, threads) = (
                up.clone(),
                down.clone(),
                connections.clone(),
                stopping.clone(),
                threads.clone(),
            );
            std::thread::Builder::new()
                .name("byte-counter".into())
                .spawn(move || {
                    while !stopping.load(Ordering::SeqCst) {
                        let client = match listener.accept() {
                            Ok((client, _)) => client,
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_millis(5));
                                continue;
                            }
                            Err(_) => continue,
                        };
                        let Ok(server) =
                            TcpStream::connect_timeout(&target, Duration::from_secs(5))
                        else {
                            continue;
                        };
                        connections.fetch_add(1, Ordering::SeqCst);
                        let _ = client.set_nonblocking(false);
                        let pairs = [
                            (
                                client.try_clone().unwrap(),
                                server.try_clone().unwrap(),
                                up.clone(),
                            ),
                            (server, client, down.clone()),
                        ];
                        for (from, to, counted) in pairs {
                            let stopping = stopping.clone();
                            let copier = std::thread::Builder::new()
                                .name("byte-counter-copy".into())
                                .spawn(move || copy(from, to, &counted, &stopping))
                                .unwrap();
                            threads.lock().unwrap().push(copier);
                        }
                    }
                })
                .unwrap()
        };
        ByteCounter {
            port,
            up,
            down,
            connections,
            stopping,
            threads,
            acceptor: Some(acceptor),
        }
    }

    /// Every byte that crossed, both ways.
    pub fn total(&self) -> u64 {
        self.up.load(Ordering::SeqCst) + self.down.load(Ordering::SeqCst)
    }

    /// Connections forwarded so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to`, counting, until either side closes or the forwarder stops.
fn copy(mut from: TcpStream, mut to: TcpStream, counted: &AtomicU64, stopping: &AtomicBool) {
    let _ = from.set_read_timeout(Some(LOOK_EVERY));
    let _ = to.set_write_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 16 * 1024];
    while !stopping.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                counted.fetch_add(n as u64, Ordering::SeqCst);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for ByteCounter {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for thread in self.threads.lock().unwrap().drain(..) {
            let _ = thread.join();
        }
    }
}
