//! A forwarding HTTP proxy on 127.0.0.1 for the tests: it tunnels `CONNECT host:port` (the
//! way HTTPS goes through a proxy) and forwards plain HTTP requests in absolute form
//! (`POST http://host:port/path`), optionally asking for `Proxy-Authorization: Basic`
//! credentials, and can refuse with 407 for a spell. It counts the tunnels it opened, the
//! requests it forwarded and the credentials it saw.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does and saw.
#[derive(Default)]
pub struct ProxyState {
    /// `user:password` it asks for, if any.
    pub credentials: Option<String>,
    /// While set, every request gets 407.
    pub refusing: AtomicBool,
    /// Tunnels opened.
    pub tunnels: AtomicUsize,
    /// Absolute-form requests forwarded and answered.
    pub forwarded: AtomicUsize,
    /// The method and target of every absolute-form request.
    pub request_lines: Mutex<Vec<String>>,
    /// Requests refused with 407.
    pub refused: AtomicUsize,
    /// The `Proxy-Authorization` values seen.
    pub authorizations: Mutex<Vec<String>>,
}

pub struct ForwardProxy {
    pub addr: SocketAddr,
    pub state: Arc<ProxyState>,
}

impl ForwardProxy {
    pub fn start(credentials: Option<&str>) -> ForwardProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState {
            credentials: credentials.map(str::to_string),
            ..Default::default()
        });
        let shared = Arc::clone(&state);
        std::thread::Builder::new()
            .name("forward-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    let state = Arc::clone(&shared);
                    std::thread::spawn(move || {
                        let _ = serve(client, &state);
                    });
                }
            })
            .unwrap();
        ForwardProxy { addr, state }
    }

    /// The proxy's URL, with `user:password@` if given.
    pub fn url(&self, credentials: Option<&str>) -> String {
        match credentials {
            Some(c) => format!("http://{c}@{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }
}

/// One request's head as the proxy read it.
struct Head {
    method: String,
    target: String,
    /// Every header line but `Proxy-Authorization`, as sent.
    headers: Vec<String>,
    authorization: Option<String>,
    content_length: usize,
}

/// Reads a request or response head: `None` when the peer closed before one began.
fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Head>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut head = Head {
        method,
        target,
        headers: Vec::new(),
        authorization: None,
        content_length: 0,
    };
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("proxy-authorization") {
            head.authorization = Some(value.trim().to_string());
            continue;
        }
        if name.eq_ignore_ascii_case("content-length") {
            head.content_length = value.trim().parse().unwrap_or(0);
        }
        head.headers.push(header.trim_end().to_string());
    }
    Ok(Some(head))
}

/// One client connection: CONNECT opens a tunnel; requests in absolute form
/// (`POST http://host:port/path HTTP/1.1`) are forwarded one by one, in origin form, and
/// their answers relayed, for as long as the client keeps the connection.
fn serve(client: TcpStream, state: &ProxyState) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client_w = client.try_clone()?;
    let wanted = state.credentials.as_ref().map(|c| {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(c.as_bytes())
        )
    });
    // The upstream connection of absolute-form requests, kept between them.
    let mut upstream: Option<(String, BufReader<TcpStream>)> = None;
    while let Some(head) = read_head(&mut reader)? {
        let mut body = vec![0u8; head.content_length];
        std::io::Read::read_exact(&mut reader, &mut body)?;
        if let Some(value) = &head.authorization {
            state.authorizations.lock().unwrap().push(value.clone());
        }
        let allowed = wanted.is_none() || head.authorization == wanted;
        if state.refusing.load(Ordering::SeqCst) || !allowed {
            state.refused.fetch_add(1, Ordering::SeqCst);
            client_w.write_all(
                b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic realm=\"t\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )?;
            return Ok(());
        }
        if head.method == "CONNECT" {
            return tunnel(reader, client_w, &head.target, state);
        }
        state
            .request_lines
            .lock()
            .unwrap()
            .push(format!("{} {}", head.method, head.target));
        let Some(rest) = head.target.strip_prefix("http://") else {
            client_w.write_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )?;
            return Ok(());
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        if upstream.as_ref().map(|(a, _)| a.as_str()) != Some(authority) {
            upstream = match TcpStream::connect(authority) {
                Ok(stream) => Some((authority.to_string(), BufReader::new(stream))),
                Err(_) => {
                    client_w.write_all(
                        b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )?;
                    return Ok(());
                }
            };
        }
        let Some((_, up)) = upstream.as_mut() else {
            return Ok(());
        };
        let mut request = format!("{} {path} HTTP/1.1\r\n", head.method);
        for header in &head.headers {
            request.push_str(header);
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        let mut out = request.into_bytes();
        out.extend_from_slice(&body);
        up.get_mut().write_all(&out)?;
        // The answer, relayed as it came: its head and its content-length body.
        let mut status_line = String::new();
        if up.read_line(&mut status_line)? == 0 {
            client_w.write_all(
                b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )?;
            return Ok(());
        }
        let mut answer = status_line.into_bytes();
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if up.read_line(&mut header)? == 0 || header.trim().is_empty() {
                answer.extend_from_slice(b"\r\n");
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            answer.extend_from_slice(header.as_bytes());
        }
        let mut answer_body = vec![0u8; length];
        std::io::Read::read_exact(up, &mut answer_body)?;
        answer.extend_from_slice(&answer_body);
        state.forwarded.fetch_add(1, Ordering::SeqCst);
        client_w.write_all(&answer)?;
    }
    Ok(())
}

/// Opens the tunnel of a CONNECT to `target` and copies bytes both ways until either side
/// closes.
fn tunnel(
    reader: BufReader<TcpStream>,
    mut client_w: TcpStream,
    target: &str,
    state: &ProxyState,
) -> std::io::Result<()> {
    let Ok(upstream) = TcpStream::connect(target) else {
        client_w.write_all(
            b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )?;
        return Ok(());
    };
    state.tunnels.fetch_add(1, Ordering::SeqCst);
    client_w.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")?;
    let mut upstream_r = upstream.try_clone()?;
    let mut upstream_w = upstream;
    // Bytes the client sent after its CONNECT head are in the reader's buffer.
    let buffered = reader.buffer().to_vec();
    upstream_w.write_all(&buffered)?;
    let mut client_r = reader.into_inner();
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_r, &mut upstream_w);
        let _ = upstream_w.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut upstream_r, &mut client_w);
    let _ = client_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
    Ok(())
}
