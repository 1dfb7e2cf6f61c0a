//! A plain HTTP/1.1 server on a loopback port: a thread per connection, keep-alive,
//! `content-length` bodies, and a handler that turns each request into a response.
//!
//! The one receiver of the tests, the benches and the examples (which include this file by
//! path). Written by hand rather than with tiny_http, whose task pool can leave a new
//! connection queued for seconds once more than four are open.
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Bodies larger than this are refused with 413 unless the server is told otherwise.
pub const DEFAULT_MAX_BODY: usize = 16 << 20;
/// Headers per request, at most; a request with more is refused (431) and its connection
/// closed, so a sender cannot make the server hold or parse unbounded heads.
pub const MAX_HEADERS: usize = 100;
/// The longest request or header line, in bytes.
pub const MAX_LINE: u64 = 16 * 1024;

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// How many requests came before this one on its connection (0: a new connection).
    pub earlier_on_connection: usize,
}

impl Request {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the request carries a stream's accounting (a CloudEvent of type
    /// `sqlite_outbox::wire::ACCOUNTING_TYPE`) rather than events: a receiver that is not
    /// `outbox ingest` answers it and ignores it.
    pub fn is_stream_accounting(&self) -> bool {
        let Ok(body) = serde_json::from_slice::<serde_json::Value>(&self.body) else {
            return false;
        };
        let first = match &body {
            serde_json::Value::Array(items) => items.first().cloned().unwrap_or_default(),
            other => other.clone(),
        };
        first["type"] == sqlite_outbox::wire::ACCOUNTING_TYPE
    }
}

/// What the server answers.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Hold the answer this long first (or until the server stops): a slow or hung receiver.
    pub hold: Option<Duration>,
    /// Close the connection instead of answering: a receiver that resets mid-response.
    pub reset: bool,
}

impl Response {
    pub fn status(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            hold: None,
            reset: false,
        }
    }

    /// No answer at all: the connection is closed once the request is read.
    pub fn reset() -> Response {
        Response {
            reset: true,
            ..Response::status(0)
        }
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Response {
        self.body = body.into();
        self
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    pub fn after(mut self, hold: Duration) -> Response {
        self.hold = Some(hold);
        self
    }
}

type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A running server; stopping it (or dropping it) closes the port and joins every thread.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `handler` on `addr` (port 0 for any free one).
    pub fn bind(
        addr: impl ToSocketAddrs,
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> io::Result<HttpServer> {
        Self::bind_with_limit(addr, DEFAULT_MAX_BODY, handler)
    }

    /// Like [`bind`](Self::bind), refusing bodies over `max_body` bytes with 413.
    pub fn bind_with_limit(
        addr: impl ToSocketAddrs,
        max_body: usize,
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> io::Result<HttpServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Handler = Arc::new(handler);
        let thread = {
            let stop = stop.clone();
            thread::Builder::new()
                .name(format!("http-server-{}", addr.port()))
                .spawn(move || accept_loop(listener, stop, handler, max_body))?
        };
        Ok(HttpServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes the port, and waits for open connections to end.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shut();
    }
}

fn accept_loop(listener: TcpListener, stop: Arc<AtomicBool>, handler: Handler, max_body: usize) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let (stop, handler) = (stop.clone(), handler.clone());
                let spawned = thread::Builder::new()
                    .name("http-connection".into())
                    .spawn(move || serve_connection(stream, &stop, &*handler, max_body));
                if let Ok(t) = spawned {
                    connections.push(t);
                }
                connections.retain(|t| !t.is_finished());
            }
            Err(_) => thread::sleep(Duration::from_millis(2)),
        }
    }
    // Closing the listener (dropping it) refuses new connections; wait for the open ones.
    drop(listener);
    for c in connections {
        let _ = c.join();
    }
}

/// A request's method, path and headers.
type Head = (String, String, Vec<(String, String)>);

/// Why a request's head was not read.
enum BadHead {
    /// The connection ended or broke: nothing to answer.
    Gone,
    /// Too many headers, or a line too long: answer 431 and close.
    TooLarge,
}

/// Reads one line of at most `MAX_LINE` bytes.
fn read_line(reader: &mut BufReader<TcpStream>, line: &mut String) -> Result<(), BadHead> {
    line.clear();
    let n = reader
        .by_ref()
        .take(MAX_LINE)
        .read_line(line)
        .map_err(|_| BadHead::Gone)?;
    match n {
        0 => Err(BadHead::Gone),
        _ if !line.ends_with('\n') => Err(BadHead::TooLarge),
        _ => Ok(()),
    }
}

/// Reads one request's head; the body is left to the caller.
fn read_head(reader: &mut BufReader<TcpStream>) -> Result<Head, BadHead> {
    let mut line = String::new();
    read_line(reader, &mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().ok_or(BadHead::Gone)?.to_string();
    let path = parts.next().ok_or(BadHead::Gone)?.to_string();
    let mut headers = Vec::new();
    loop {
        read_line(reader, &mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(BadHead::TooLarge);
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok((method, path, headers))
}

fn serve_connection(
    stream: TcpStream,
    stop: &AtomicBool,
    handler: &dyn Fn(&Request) -> Response,
    max_body: usize,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    // Wake up now and then to notice a stop.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut earlier_on_connection = 0;
    while !stop.load(Ordering::SeqCst) {
        // Wait for the first byte of the next request without consuming it.
        match reader.fill_buf() {
            Ok([]) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        }
        let _ = reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(5)));
        let (method, path, headers) = match read_head(&mut reader) {
            Ok(head) => head,
            Err(BadHead::Gone) => return,
            Err(BadHead::TooLarge) => {
                let text = format!("at most {MAX_HEADERS} headers of {MAX_LINE} bytes");
                let _ = write_response(&mut writer, &Response::status(431).body(text), true);
                return;
            }
        };
        let length: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        if length > max_body {
            let text = format!("body over {max_body} bytes");
            let _ = write_response(&mut writer, &Response::status(413).body(text), true);
            return;
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let _ = reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(100)));
        let request = Request {
            method,
            path,
            headers,
            body,
            earlier_on_connection,
        };
        earlier_on_connection += 1;
        let response = handler(&request);
        if let Some(hold) = response.hold {
            let until = Instant::now() + hold;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(10));
            }
        }
        if response.reset {
            let _ = writer.shutdown(std::net::Shutdown::Both);
            return;
        }
        if write_response(&mut writer, &response, false).is_err() {
            return;
        }
    }
}

fn write_response(writer: &mut TcpStream, response: &Response, close: bool) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} X\r\ncontent-length: {}\r\n",
        response.status,
        response.body.len()
    );
    // Every real server says what time it is; a handler may say otherwise.
    if !response
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("date"))
    {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        head.push_str(&format!("date: {now}\r\n"));
    }
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if close {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&response.body);
    writer.write_all(&bytes)
}
