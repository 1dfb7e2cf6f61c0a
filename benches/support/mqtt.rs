#![allow(dead_code)]
//! The MQTT comparison of the bench example: the relay publishing to a Mosquitto broker on
//! 127.0.0.1 against a bare rumqttc QoS 1 publish loop with the same in-flight window, both
//! timed until the broker acknowledged every message.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, MqttOptions, Outgoing, Packet, QoS};

/// A throwaway anonymous broker (no persistence), killed when dropped.
pub struct Broker {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Broker {
    /// Starts `mosquitto` (Debian package `mosquitto`) on a free port; `None` if it is not
    /// installed.
    pub fn start() -> Option<Broker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        Self::start_on(port)
    }

    /// Starts `mosquitto` on `port` of 127.0.0.1; `None` if it is not installed.
    pub fn start_on(port: u16) -> Option<Broker> {
        let program = ["/usr/sbin/mosquitto", "mosquitto"]
            .into_iter()
            .find(|p| Command::new(p).arg("-h").output().is_ok())?;
        let dir = tempfile::tempdir().ok()?;
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!("user root\nlistener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"),
        )
        .ok()?;
        let child = Command::new(program)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Broker {
            port,
            child,
            _dir: dir,
        })
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes `n` copies of `payload` at QoS 1 with at most `window` unacknowledged, and
/// returns how long until the last PUBACK.
pub fn bare_publish(port: u16, payload: &[u8], n: usize, window: u16) -> Duration {
    let mut options =
        MqttOptions::new(format!("bare-{:08x}", fastrand::u32(..)), "127.0.0.1", port);
    options
        .set_inflight(window)
        .set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut connection) = Client::new(options, window as usize);
    let acked = Arc::new(AtomicU64::new(0));
    let counted = acked.clone();
    let reader = std::thread::Builder::new()
        .name("bench-mqtt-bare".into())
        .spawn(move || {
            for event in connection.iter() {
                match event {
                    Ok(Event::Incoming(Packet::PubAck(_)))
                        if counted.fetch_add(1, Ordering::Relaxed) + 1 == n as u64 =>
                    {
                        return;
                    }
                    Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => return,
                    _ => {}
                }
            }
        })
        .expect("spawn bare reader");
    let started = Instant::now();
    for _ in 0..n {
        // Blocks while the window is full: the event loop stops taking requests.
        client
            .publish("bench/bare", QoS::AtLeastOnce, false, payload.to_vec())
            .expect("publish");
    }
    let _ = reader.join();
    let took = started.elapsed();
    assert_eq!(
        acked.load(Ordering::Relaxed),
        n as u64,
        "every publish acked"
    );
    let _ = client.try_disconnect();
    took
}
