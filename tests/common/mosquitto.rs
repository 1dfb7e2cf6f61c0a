//! A Mosquitto broker of the test's own, on a free loopback port with a config in a temp
//! folder (persistence on and saved on every change, so a killed broker keeps its sessions),
//! and a subscriber that records what the broker hands out.

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `mosquitto`; stopped (SIGKILL) when dropped.
pub struct Mosquitto {
    /// The plain listener (subscribers use it).
    pub port: u16,
    /// The TLS listener, when the setup asked for one.
    pub tls_port: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

/// How to set a broker up beyond the defaults (anonymous, plain listener only).
#[derive(Default)]
pub struct Setup {
    pub auth: Option<Auth>,
    /// A second listener with TLS.
    pub tls: Option<Tls>,
    /// More `mosquitto.conf` lines, like `max_packet_size 2048`.
    pub extra: &'static str,
}

/// The certificates of a TLS listener.
pub struct Tls {
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// The CA that signs client certificates.
    pub client_ca: PathBuf,
    /// Refuse clients without a certificate that `client_ca` signed.
    pub require_certificate: bool,
}

/// Who may do what, for a broker with authentication.
pub struct Auth {
    pub user: &'static str,
    pub password: &'static str,
    /// ACL lines for that user, like `topic readwrite outbox/#`.
    pub acl: &'static [&'static str],
}

impl Mosquitto {
    /// Starts an anonymous broker.
    pub fn start() -> Mosquitto {
        Self::start_with(None)
    }

    /// Starts a broker that takes only `auth`'s user, if given.
    pub fn start_with(auth: Option<Auth>) -> Mosquitto {
        Self::start_setup(Setup {
            auth,
            ..Setup::default()
        })
    }

    /// Starts a broker as `setup` says.
    pub fn start_setup(setup: Setup) -> Mosquitto {
        let Setup { auth, tls, extra } = setup;
        let dir = tempfile::tempdir().unwrap();
        let port = crate::common::closed_port();
        let mut conf = format!(
            "user root\nlistener {port} 127.0.0.1\npersistence true\npersistence_location {}/\n\
             autosave_interval 1\nautosave_on_changes true\nset_tcp_nodelay true\nlog_dest stderr\n",
            dir.path().display()
        );
        match auth {
            None => conf.push_str("allow_anonymous true\n"),
            Some(auth) => {
                let passwd = dir.path().join("passwd");
                let status = Command::new("mosquitto_passwd")
                    .args(["-c", "-b"])
                    .arg(&passwd)
                    .args([auth.user, auth.password])
                    .status()
                    .expect("run mosquitto_passwd");
                assert!(status.success());
                let acl = dir.path().join("acl");
                let mut rules = format!("user {}\n", auth.user);
                for line in auth.acl {
                    rules.push_str(line);
                    rules.push('\n');
                }
                std::fs::write(&acl, rules).unwrap();
                conf.push_str(&format!(
                    "allow_anonymous false\npassword_file {}\nacl_file {}\n",
                    passwd.display(),
                    acl.display()
                ));
            }
        }
        conf.push_str(extra);
        conf.push('\n');
        let tls_port = tls.map(|tls| {
            let tls_port = crate::common::closed_port();
            conf.push_str(&format!(
                "listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\n\
                 require_certificate {}\n",
                tls.client_ca.display(),
                tls.server_cert.display(),
                tls.server_key.display(),
                tls.require_certificate
            ));
            tls_port
        });
        std::fs::write(dir.path().join("mosquitto.conf"), conf).unwrap();
        let mut broker = Mosquitto {
            port,
            tls_port,
            dir,
            child: None,
        };
        broker.restart();
        broker
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("mosquitto.conf")
    }

    /// (Re)starts the process on the same port, config and persistence file.
    pub fn restart(&mut self) {
        // Debian puts the broker in /usr/sbin, which a non-root PATH may lack.
        let program = if std::path::Path::new("/usr/sbin/mosquitto").exists() {
            "/usr/sbin/mosquitto"
        } else {
            "mosquitto"
        };
        let child = Command::new(program)
            .arg("-c")
            .arg(self.config())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto (Debian package mosquitto)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        for port in std::iter::once(self.port).chain(self.tls_port) {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "mosquitto did not start listening"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// The TLS listener's URL.
    pub fn tls_url(&self) -> String {
        format!(
            "mqtts://127.0.0.1:{}",
            self.tls_port.expect("a broker set up with TLS")
        )
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One message as a subscriber got it.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub payload: serde_json::Value,
}

/// A subscriber to `filter` with a persistent session (QoS 1), so that messages published
/// while it or the broker was down reach it later. Its thread runs until the test ends.
pub struct Subscriber {
    pub messages: Arc<Mutex<Vec<Message>>>,
}

impl Subscriber {
    /// Connects, subscribes and returns once the broker confirmed the subscription.
    pub fn start(port: u16, filter: &str, credentials: Option<(&str, &str)>) -> Subscriber {
        use rumqttc::{Client, Event, MqttOptions, Packet, QoS};
        let mut options =
            MqttOptions::new(format!("sub-{:08x}", fastrand::u32(..)), "127.0.0.1", port);
        options
            .set_clean_session(false)
            .set_keep_alive(Duration::from_secs(5))
            .set_max_packet_size(1 << 20, 1 << 20);
        if let Some((u, p)) = credentials {
            options.set_credentials(u, p);
        }
        let (client, mut connection) = Client::new(options, 16);
        let messages = Arc::new(Mutex::new(Vec::new()));
        let (subscribed_tx, subscribed_rx) = crossbeam_channel::bounded(1);
        let seen = messages.clone();
        let filter = filter.to_string();
        std::thread::Builder::new()
            .name("test-mqtt-subscriber".into())
            .spawn(move || loop {
                match connection.recv() {
                    Ok(Ok(Event::Incoming(Packet::ConnAck(ack)))) => {
                        if !ack.session_present {
                            let _ = client.try_subscribe(filter.clone(), QoS::AtLeastOnce);
                        }
                    }
                    Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {
                        let _ = subscribed_tx.try_send(());
                    }
                    Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                        seen.lock().unwrap().push(Message {
                            topic: p.topic.clone(),
                            payload: serde_json::from_slice(&p.payload)
                                .unwrap_or(serde_json::Value::Null),
                        });
                    }
                    Ok(Ok(_)) => {}
                    // The broker went away: try again shortly (it may be restarted).
                    Ok(Err(_)) => std::thread::sleep(Duration::from_millis(100)),
                    Err(_) => return,
                }
            })
            .unwrap();
        subscribed_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the broker confirmed the subscription");
        Subscriber { messages }
    }

    pub fn count(&self) -> usize {
        self.messages.lock().unwrap().len()
    }

    pub fn messages(&self) -> Vec<Message> {
        self.messages.lock().unwrap().clone()
    }
}

/// One message as an MQTT 5 subscriber got it, properties included.
#[derive(Debug, Clone)]
pub struct Message5 {
    pub topic: String,
    pub content_type: Option<String>,
    pub user_properties: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Message5 {
    /// The value of user property `name`.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.user_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An MQTT 5 subscriber to `filter` (clean start), recording properties. Its thread runs
/// until the test ends.
pub struct Subscriber5 {
    pub messages: Arc<Mutex<Vec<Message5>>>,
}

impl Subscriber5 {
    /// Connects, subscribes and returns once the broker confirmed the subscription.
    pub fn start(port: u16, filter: &str) -> Subscriber5 {
        use rumqttc::v5::mqttbytes::v5::Packet;
        use rumqttc::v5::mqttbytes::QoS;
        use rumqttc::v5::{Client, Event, MqttOptions};
        let mut options =
            MqttOptions::new(format!("sub5-{:08x}", fastrand::u32(..)), "127.0.0.1", port);
        options
            .set_keep_alive(Duration::from_secs(5))
            .set_max_packet_size(Some(1 << 20));
        let (client, mut connection) = Client::new(options, 16);
        let messages = Arc::new(Mutex::new(Vec::new()));
        let (subscribed_tx, subscribed_rx) = crossbeam_channel::bounded(1);
        let seen = messages.clone();
        let filter = filter.to_string();
        std::thread::Builder::new()
            .name("test-mqtt5-subscriber".into())
            .spawn(move || loop {
                match connection.recv() {
                    Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {
                        let _ = client.try_subscribe(filter.clone(), QoS::AtLeastOnce);
                    }
                    Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {
                        let _ = subscribed_tx.try_send(());
                    }
                    Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                        let properties = p.properties.clone().unwrap_or_default();
                        seen.lock().unwrap().push(Message5 {
                            topic: String::from_utf8_lossy(&p.topic).into_owned(),
                            content_type: properties.content_type,
                            user_properties: properties.user_properties,
                            payload: p.payload.to_vec(),
                        });
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => std::thread::sleep(Duration::from_millis(100)),
                    Err(_) => return,
                }
            })
            .unwrap();
        subscribed_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the broker confirmed the subscription");
        Subscriber5 { messages }
    }

    pub fn messages(&self) -> Vec<Message5> {
        self.messages.lock().unwrap().clone()
    }
}
