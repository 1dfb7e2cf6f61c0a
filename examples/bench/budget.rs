//! The data budget's rows (issue 69; `-- budget`, and with the metered links' `-- frugal`):
//! what a budget costs a drain (a relay with a budget against the same relay without, in
//! the same run), and how close its count comes to the bytes a forwarder in front of the
//! receiver counted on the sockets, over plain HTTP and over HTTPS.

use std::time::{Duration, Instant};

use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Destination, Outbox, RelayConfig};

use super::byte_counter::ByteCounter;
use super::https_receiver::HttpsReceiver;
use super::support::*;
use super::test_ca::TestCa;
use super::{alternate_spread, rate, Line};

/// Events per drain of [`cost`], one a request: the budget's work is per request.
const COST_EVENTS: usize = 20_000;
/// Events per drain of [`accuracy`].
const ACCURACY_EVENTS: usize = 2_000;
/// A budget no drain here reaches: its whole cost, and nothing held.
const LARGE: u64 = 1_000_000_000_000;
const MONTH: Duration = Duration::from_secs(30 * 86_400);

pub fn rows(dir: &std::path::Path) -> Vec<Line> {
    let mut lines = vec![cost(dir)];
    lines.extend(accuracy(dir));
    lines
}

/// A drain of [`COST_EVENTS`] at one event a request with two workers, with a budget and
/// without, alternated over five rounds.
fn cost(dir: &std::path::Path) -> Line {
    let receiver = CountingReceiver::start();
    let round = std::cell::Cell::new(0);
    let drain = |budget: bool| {
        round.set(round.get() + 1);
        let outbox = Outbox::open(dir.join(format!("budget-cost-{}.db", round.get()))).unwrap();
        fill_pending(&outbox, COST_EVENTS);
        let mut destination = Destination::http("default", &receiver.url);
        if budget {
            destination = destination.budget(LARGE, MONTH);
        }
        let config = RelayConfig::new().destination(destination).workers(2);
        let (took, ()) = time_drain_to(&outbox, &receiver, COST_EVENTS, config, || ());
        rate(COST_EVENTS, took)
    };
    let rates = alternate_spread(5, || drain(true), || drain(false));
    Line::rates(
        format!("relay drain with a data budget, 1 event/request, {COST_EVENTS} queued"),
        "events",
        rates.a,
        rates.b,
        "no budget",
        "≥ 0.95×",
    )
    .with_spread(&rates)
}

/// The budget's count against the bytes a forwarder in front of the receiver counted, each
/// way, for a drain of [`ACCURACY_EVENTS`] over HTTP and over HTTPS.
fn accuracy(dir: &std::path::Path) -> Vec<Line> {
    let plain = CountingReceiver::start();
    let plain_port = plain
        .url
        .split(':')
        .nth(2)
        .and_then(|rest| rest.split('/').next());
    let plain_port: u16 = plain_port.unwrap().parse().unwrap();
    let ca = TestCa::new("bench CA");
    let tls = HttpsReceiver::start(&ca.server(), None);
    let pem = std::fs::read(ca.ca_pem()).unwrap();
    let mut lines = Vec::new();
    for (name, target, scheme, http) in [
        (
            "HTTP",
            std::net::SocketAddr::from(([127, 0, 0, 1], plain_port)),
            "http",
            HttpConfig::new(),
        ),
        (
            "HTTPS",
            tls.addr,
            "https",
            HttpConfig::new().ca_pem(pem.clone()),
        ),
    ] {
        let counter = ByteCounter::start(target);
        let outbox = Outbox::open(dir.join(format!("budget-{scheme}.db"))).unwrap();
        fill_pending(&outbox, ACCURACY_EVENTS);
        let url = format!("{scheme}://127.0.0.1:{}/events", counter.port);
        let destination = Destination::http("default", url)
            .http_config(http)
            .budget(LARGE, MONTH);
        let relay = outbox
            .relay(RelayConfig::new().destination(destination).workers(2))
            .start()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while outbox.pending_count(None).unwrap() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = relay.shutdown();
        let counted = outbox.budget("default").unwrap().unwrap().used_bytes;
        let crossed = counter.total();
        lines.push(Line {
            what: format!(
                "data budget's count against the sockets', {name}, {ACCURACY_EVENTS} events, 1 a request"
            ),
            outbox: format!("{counted} B counted"),
            baseline: format!("{crossed} B crossed"),
            ratio: format!("{:.3}×", counted as f64 / crossed as f64),
            target: "within 2%",
        });
    }
    lines
}
