//! The HTTP transport's TCP connections: a request leaves in one write, and socket
//! timeouts are set a few times a second rather than before every read and write.
//!
//! ureq's own TCP transport writes a request's head and its body with a write each. With
//! `TCP_NODELAY` on (ureq's default, and right for request and response) that is two
//! segments per request: two packets on a metered uplink, and on the receiving host two
//! passes through its network stack and two wakeups of its reader. This transport holds
//! what ureq hands it until ureq turns to wait for the answer, then writes it all at once;
//! a request larger than [`MAX_HELD`] (a big batch) goes out as it is produced.
//!
//! Timeouts: ureq hands every read and write the time left until the request's deadline,
//! which differs on every call, so its transport called `setsockopt` at least twice per
//! request (`perf` of the workers at one event per request: 7% of their time). Here the
//! time left is rounded *up* to a multiple of [`GRAIN`] and set only when that changes: a
//! keep-alive connection's next request, a full timeout away again, finds the socket
//! already set. A blocking call may outlast the deadline by less than a grain, far inside
//! the lease (at least twice the request timeout). A deadline already passed fails at once.
//!
//! TLS is layered on top by ureq's rustls connector, which hands its records to this
//! transport the same way, so an HTTPS request is one write too.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ureq::unversioned::transport::time::Duration as UreqDuration;
use ureq::unversioned::transport::{
    Buffers, ChainedConnector, ConnectProxyConnector, ConnectionDetails, Connector, Either,
    LazyBuffers, NextTimeout, RustlsConnector, ShutdownHandle, Transport,
};
use ureq::{Error, Timeout};

use super::absolute_form::AbsoluteForm;

/// The most request bytes held back to go out in one write.
const MAX_HELD: usize = 64 * 1024;

/// The step a timeout is rounded up to.
const GRAIN: Duration = Duration::from_millis(250);

/// The shortest connect timeout an address is given when a host has several.
const MIN_CONNECT_PER_ADDRESS: Duration = Duration::from_millis(10);

thread_local! {
    /// How many connections this thread has opened: a request that opened none went on a
    /// connection from the pool (see [`connections_opened_here`]).
    static OPENED_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many connections the calling thread has opened so far. ureq opens a connection on
/// the thread that sends the request, and only when its pool has none to reuse, so a
/// request during which this did not change went on a kept-alive connection.
pub(crate) fn connections_opened_here() -> u64 {
    OPENED_HERE.with(|n| n.get())
}

/// The HTTP transport's connector chain: these TCP connections, with TLS over them for
/// `https://` URLs. No proxy connectors: the transport's agent is configured with no proxy.
pub(crate) fn connector() -> ChainedConnector<(), OneWriteTcpConnector, RustlsConnector> {
    OneWriteTcpConnector::default().chain(RustlsConnector::default())
}

/// The connector chain of an `https://` destination through a forward proxy: a CONNECT
/// tunnel per connection (ureq's), made of these TCP connections to the proxy, with TLS
/// through the tunnel. The proxy's CONNECT and its answer are on these connections too, so
/// a data budget counts them.
pub(crate) fn connector_through_tunnel() -> ChainedConnector<
    (),
    ChainedConnector<(), ConnectProxyConnector, OneWriteTcpConnector>,
    RustlsConnector,
> {
    ConnectProxyConnector::default()
        .chain(OneWriteTcpConnector::default())
        .chain(RustlsConnector::default())
}

/// The connector chain of a plain `http://` destination through a forward proxy: these
/// TCP connections (to the proxy, which the agent's resolver looks up), every request in
/// absolute form (see [`super::absolute_form`]).
pub(crate) fn connector_through_proxy(
    form: Arc<AbsoluteForm>,
) -> ChainedConnector<(), OneWriteTcpConnector, RustlsConnector> {
    OneWriteTcpConnector {
        absolute_form: Some(form),
    }
    .chain(RustlsConnector::default())
}

/// Opens plain TCP connections for ureq (first in the connector chain).
#[derive(Debug, Default)]
pub(crate) struct OneWriteTcpConnector {
    /// Set when the connections go to a forward proxy.
    absolute_form: Option<Arc<AbsoluteForm>>,
}

impl<In: Transport> Connector<In> for OneWriteTcpConnector {
    type Out = Either<In, OneWriteTcp>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, Error> {
        // A connection made before this one in the chain (a CONNECT tunnel, itself made of
        // these connections to the proxy) is taken as it is.
        if let Some(chained) = chained {
            return Ok(Some(Either::A(chained)));
        }
        let stream = connect_any(details)?;
        OPENED_HERE.with(|n| n.set(n.get() + 1));
        if details.config.no_delay() {
            stream.set_nodelay(true)?;
        }
        let stream = Arc::new(stream);
        // Lets the agent shut the socket down from another thread.
        let handle: Weak<dyn ShutdownHandle> = Arc::downgrade(&stream) as Weak<dyn ShutdownHandle>;
        (details.register_shutdown)(handle)?;
        Ok(Some(Either::B(OneWriteTcp {
            stream,
            buffers: LazyBuffers::new(
                details.config.input_buffer_size(),
                details.config.output_buffer_size(),
            ),
            held: Vec::new(),
            read_timeout: None,
            write_timeout: None,
            absolute_form: self.absolute_form.clone(),
            request_begins: true,
        })))
    }
}

/// Tries the host's addresses in turn, each with a share of the connect timeout (half of
/// what is left to the first, and so on; the last gets all that is left).
fn connect_any(details: &ConnectionDetails) -> Result<TcpStream, Error> {
    let deadline = details
        .timeout
        .not_zero()
        .map(|left| Instant::now() + *left);
    let addrs: Vec<SocketAddr> = details.addrs.iter().copied().collect();
    let mut last_error = None;
    for (index, addr) in addrs.iter().enumerate() {
        let is_last = index + 1 == addrs.len();
        let attempt = match deadline {
            None => TcpStream::connect(addr),
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout(details.timeout.reason));
                }
                let share = if is_last { left } else { left / 2 };
                TcpStream::connect_timeout(addr, share.max(MIN_CONNECT_PER_ADDRESS))
            }
        };
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(e)
                if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock =>
            {
                last_error = Some(Error::Timeout(Timeout::Connect));
            }
            Err(e) => last_error = Some(Error::Io(e)),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        Error::Io(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            "the host has no address",
        ))
    }))
}

/// One TCP connection, holding a request's bytes until ureq waits for the answer.
pub(crate) struct OneWriteTcp {
    stream: Arc<TcpStream>,
    buffers: LazyBuffers,
    /// Request bytes not yet written.
    held: Vec<u8>,
    /// The timeouts last set on the socket.
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// How request heads are rewritten for a forward proxy, if the connection goes to one.
    absolute_form: Option<Arc<AbsoluteForm>>,
    /// Whether the next bytes handed over begin a request: true on a new connection and
    /// once an answer is awaited (ureq sends nothing of a request after that).
    request_begins: bool,
}

impl std::fmt::Debug for OneWriteTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneWriteTcp")
            .field("peer", &self.stream.peer_addr().ok())
            .field("held", &self.held.len())
            .finish()
    }
}

impl OneWriteTcp {
    /// Writes what is held, within `timeout`.
    fn write_held(&mut self, timeout: NextTimeout) -> Result<(), Error> {
        if self.held.is_empty() {
            return Ok(());
        }
        let timeout = timeout.for_write();
        let limit = socket_timeout(timeout)?;
        if limit != self.write_timeout {
            self.stream.set_write_timeout(limit)?;
            self.write_timeout = limit;
        }
        let result = write_all(&mut &*self.stream, &self.held);
        self.held.clear();
        if self.held.capacity() > 2 * MAX_HELD {
            // After a large batch: do not keep its size for every later request.
            self.held = Vec::new();
        }
        result.map_err(|e| io_error(e, timeout.reason))
    }
}

impl Transport for OneWriteTcp {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        if amount == 0 {
            return Ok(());
        }
        let output = &self.buffers.output()[..amount];
        match &self.absolute_form {
            // ureq hands a request's head over whole, in its first piece.
            Some(form) if self.request_begins => {
                let head = form.rewrite(output).ok_or_else(|| {
                    Error::Io(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a request to the proxy did not begin with its request line",
                    ))
                })?;
                self.held.extend_from_slice(&head);
            }
            _ => self.held.extend_from_slice(output),
        }
        self.request_begins = false;
        if self.held.len() > MAX_HELD {
            // A large request: what is held goes now, the rest as it comes.
            return self.write_held(timeout);
        }
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        self.write_held(timeout)?;
        self.request_begins = true;
        let timeout = timeout.for_read();
        let limit = socket_timeout(timeout)?;
        if limit != self.read_timeout {
            self.stream.set_read_timeout(limit)?;
            self.read_timeout = limit;
        }
        let input = self.buffers.input_append_buf();
        let amount = loop {
            match (&*self.stream).read(input) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other.map_err(|e| io_error(e, timeout.reason))?,
            }
        };
        super::wire_meter::count_wire_bytes(amount);
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    /// Whether the connection can carry another request: nothing of an earlier request
    /// left unwritten (ureq read an answer that came before it was all sent), and the
    /// server has neither closed it nor sent anything unasked (a read that would block).
    fn is_open(&mut self) -> bool {
        self.held.is_empty() && probe_open(&self.stream)
    }
}

/// A read that does not wait: only "would block" means open and clean. On Unix one
/// `recv(MSG_PEEK | MSG_DONTWAIT)`, which leaves the socket's mode alone; elsewhere the
/// socket is made non-blocking for one read (three system calls: ureq asks before every
/// request on a kept connection, and at one event a request they showed in its profile).
#[cfg(unix)]
fn probe_open(stream: &TcpStream) -> bool {
    use rustix::net::{recv, RecvFlags};
    let mut byte = [0u8];
    matches!(
        recv(stream, &mut byte[..], RecvFlags::PEEK | RecvFlags::DONTWAIT),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK
    )
}

/// See the Unix version.
#[cfg(not(unix))]
fn probe_open(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8];
    let open = matches!(
        (&*stream).read(&mut byte),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock
    );
    stream.set_nonblocking(false).is_ok() && open
}

/// `write_all`, as one write call whenever the kernel takes it all (it does for a request
/// that fits the socket's send buffer).
fn write_all(stream: &mut impl Write, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                super::wire_meter::count_wire_bytes(n);
                bytes = &bytes[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The socket timeout for `timeout`: none if there is no deadline, the time left rounded
/// up to a grain otherwise, or the timeout error if the deadline has passed.
fn socket_timeout(timeout: NextTimeout) -> Result<Option<Duration>, Error> {
    match timeout.after {
        UreqDuration::NotHappening => Ok(None),
        UreqDuration::Exact(left) if left.is_zero() => Err(Error::Timeout(timeout.reason)),
        UreqDuration::Exact(left) => Ok(Some(round_up(left))),
    }
}

fn round_up(left: Duration) -> Duration {
    let grain = GRAIN.as_nanos();
    let nanos = left.as_nanos().div_ceil(grain).saturating_mul(grain);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// A socket timeout is ureq's timeout error (so it is reported as such), the rest as is.
fn io_error(e: io::Error, reason: Timeout) -> Error {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Error::Timeout(reason),
        _ => Error::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn connected() -> (OneWriteTcp, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let transport = OneWriteTcp {
            stream: Arc::new(client),
            buffers: LazyBuffers::new(4096, 4096),
            held: Vec::new(),
            read_timeout: None,
            write_timeout: None,
            absolute_form: None,
            request_begins: true,
        };
        (transport, server)
    }

    /// Hands `bytes` to the transport as ureq does: into its output buffer, then transmit.
    fn transmit(transport: &mut OneWriteTcp, bytes: &[u8]) {
        transport.buffers().output()[..bytes.len()].copy_from_slice(bytes);
        transport
            .transmit_output(bytes.len(), NextTimeout::default())
            .unwrap();
    }

    #[test]
    fn a_request_is_held_until_the_answer_is_awaited_then_written_at_once() {
        let (mut transport, mut server) = connected();
        let head = b"POST /events HTTP/1.1\r\ncontent-length: 4\r\n\r\n";
        transmit(&mut transport, head);
        transmit(&mut transport, b"body");
        // Nothing has left: the server finds nothing to read, however long it waits.
        std::thread::sleep(Duration::from_millis(50));
        server.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 256];
        assert_eq!(
            server.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert!(
            !transport.is_open(),
            "a connection with a request half sent is not reused"
        );
        // Waiting for the answer writes it, head and body together.
        transport.write_held(NextTimeout::default()).unwrap();
        server.set_nonblocking(false).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let n = server.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], [&head[..], b"body"].concat().as_slice());
        assert!(transport.is_open());
    }

    #[test]
    fn through_a_proxy_every_request_on_a_connection_goes_in_absolute_form() {
        let (mut transport, mut server) = connected();
        transport.absolute_form = Some(AbsoluteForm::new(
            &"http://receiver:8080/events".parse().unwrap(),
            &ureq::Proxy::new("http://proxy:3128").unwrap(),
        ));
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 512];
        for n in 0..2 {
            let body = format!("{{\"n\":{n}}}");
            transmit(
                &mut transport,
                b"POST /events HTTP/1.1\r\ncontent-length: 7\r\n\r\n",
            );
            // The body is never taken for a request line.
            transmit(&mut transport, body.as_bytes());
            server
                .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .unwrap();
            assert!(transport.await_input(NextTimeout::default()).unwrap());
            let got = server.read(&mut buf).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&buf[..got]),
                format!(
                    "POST http://receiver:8080/events HTTP/1.1\r\ncontent-length: 7\r\n\r\n{body}"
                )
            );
            let input = transport.buffers().input().len();
            transport.buffers().input_consume(input);
        }
    }

    #[test]
    fn a_large_request_goes_out_as_it_is_produced() {
        let (mut transport, mut server) = connected();
        let chunk = vec![b'x'; 4096];
        let chunks = MAX_HELD / chunk.len() + 1;
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            server
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut buf = [0u8; 8192];
            while got.len() < MAX_HELD {
                let n = server.read(&mut buf).unwrap();
                assert!(n > 0, "closed early");
                got.extend_from_slice(&buf[..n]);
            }
            got.len()
        });
        for _ in 0..chunks {
            transmit(&mut transport, &chunk);
        }
        // Past the bound, what was held was written without waiting for an answer.
        assert!(reader.join().unwrap() >= MAX_HELD);
        assert!(transport.held.is_empty());
    }

    #[test]
    fn https_requests_go_through_the_tls_layer_over_these_connections() {
        use std::io::BufRead;
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).unwrap();
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server_cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&server_key, &ca)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![server_cert.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
                )
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // Answers two requests on one connection: the second reuses it.
        let server = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let conn = rustls::ServerConnection::new(tls).unwrap();
            let mut stream = std::io::BufReader::new(rustls::StreamOwned::new(conn, tcp));
            let mut bodies = Vec::new();
            for _ in 0..2 {
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    stream.read_line(&mut line).unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0u8; length];
                stream.read_exact(&mut body).unwrap();
                bodies.push(String::from_utf8(body).unwrap());
                let writer = stream.get_mut();
                writer
                    .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                    .unwrap();
                writer.flush().unwrap();
            }
            bodies
        });
        let roots =
            ureq::tls::RootCerts::new_with_certs(&[
                ureq::tls::Certificate::from_der(ca.der()).to_owned()
            ]);
        let config = ureq::config::Config::builder()
            .tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build())
            .timeout_global(Some(Duration::from_secs(10)))
            .build();
        let agent = ureq::Agent::with_parts(
            config,
            connector(),
            ureq::unversioned::resolver::DefaultResolver::default(),
        );
        let url = format!("https://localhost:{port}/events");
        for body in ["first", "second"] {
            let response = agent.post(&url).send(body).unwrap();
            assert_eq!(response.status(), 204);
        }
        assert_eq!(server.join().unwrap(), ["first", "second"]);
    }

    #[test]
    fn time_left_is_rounded_up_to_the_grain_so_successive_calls_agree() {
        let full = Duration::from_secs(15);
        assert_eq!(round_up(full), full);
        // Each later call has a little less left: the socket keeps one value until a
        // grain has passed.
        for left_ms in [14_999, 14_900, 14_751] {
            assert_eq!(round_up(Duration::from_millis(left_ms)), full);
        }
        assert_eq!(
            round_up(Duration::from_millis(14_750)),
            Duration::from_millis(14_750)
        );
        assert_eq!(round_up(Duration::from_micros(1)), GRAIN);
    }

    #[test]
    fn a_passed_deadline_fails_and_no_deadline_sets_none() {
        let passed = NextTimeout {
            after: UreqDuration::Exact(Duration::ZERO),
            reason: Timeout::Global,
            per_read: None,
            per_write: None,
        };
        assert!(matches!(
            socket_timeout(passed),
            Err(Error::Timeout(Timeout::Global))
        ));
        assert_eq!(socket_timeout(NextTimeout::default()).unwrap(), None);
    }
}
