//! A forwarding HTTP proxy on 127.0.0.1 for the tests: it tunnels `CONNECT host:port` (the
//! way HTTPS, and with ureq plain HTTP too, goes through a proxy), optionally asking for
//! `Proxy-Authorization: Basic` credentials, and can refuse with 407 for a spell. It counts
//! the tunnels it opened and the credentials it saw.

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

/// One client: reads its CONNECT, checks the credentials, opens the tunnel and copies bytes
/// both ways until either side closes.
fn serve(client: TcpStream, state: &ProxyState) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(client.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut authorization = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("proxy-authorization") {
                authorization = Some(value.trim().to_string());
            }
        }
    }
    if let Some(value) = &authorization {
        state.authorizations.lock().unwrap().push(value.clone());
    }
    let mut client_w = client.try_clone()?;
    let wanted = state.credentials.as_ref().map(|c| {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(c.as_bytes())
        )
    });
    let allowed = wanted.is_none() || authorization == wanted;
    if state.refusing.load(Ordering::SeqCst) || !allowed {
        state.refused.fetch_add(1, Ordering::SeqCst);
        client_w.write_all(
            b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic realm=\"t\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )?;
        return Ok(());
    }
    if method != "CONNECT" {
        client_w.write_all(
            b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )?;
        return Ok(());
    }
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
