//! A plain HTTP/1.1 client over a TCP socket, for tests that need every status and header as
//! the server sent them, and requests no library would send (too large, too slow, forged).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlite_outbox::receive::{Secret, SigningKey};

/// An answer: status, headers (names lowercased) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request with `Connection: close` and reads the whole answer (10 s at most).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    read_answer(&mut stream)
}

/// The head of a `POST /events` of a body of `length` bytes with `headers`, asking the
/// server to close the connection after its answer: for a test that sends the body itself.
pub fn events_post_head(headers: &[(&str, String)], length: usize) -> String {
    let mut head = format!(
        "POST /events HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {length}\r\n"
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// Reads an answer until the server closes the connection.
pub fn read_answer(stream: &mut TcpStream) -> std::io::Result<Answer> {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {text:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_string(),
    })
}

/// The Standard Webhooks headers of `body` signed with `secret` now, as message `id`.
pub fn signed_headers(
    secret: &Secret,
    id: &str,
    body: &[u8],
    content_type: &str,
) -> Vec<(&'static str, String)> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    vec![
        ("content-type", content_type.to_string()),
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", now.to_string()),
        ("webhook-signature", secret.sign(id, now, body)),
    ]
}

/// The headers of a structured CloudEvent `body` signed now by a device's Ed25519 `key`
/// (Standard Webhooks v1a), naming its `source` in `outbox-source`.
pub fn device_signed_headers(
    key: &SigningKey,
    source: &str,
    id: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    vec![
        ("content-type", "application/cloudevents+json".to_string()),
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", now.to_string()),
        ("webhook-signature", key.sign(id, now, body)),
        ("outbox-source", source.to_string()),
    ]
}
