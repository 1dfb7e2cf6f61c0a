//! HTTP proxies (issue 57, item 1): a real forwarding proxy on loopback (CONNECT tunnels,
//! Basic credentials, a 407 spell), the library's relay and the CLI's, plain HTTP and
//! HTTPS behind a private CA.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/forward_proxy.rs"]
mod forward_proxy;
#[path = "../../tests/common/https_receiver.rs"]
mod https_receiver;
#[path = "../../tests/common/test_ca.rs"]
mod test_ca;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Reply, TestReceiver};
use forward_proxy::ForwardProxy;
use https_receiver::HttpsReceiver;
use serde_json::json;
use sqlite_outbox::transport::HttpConfig;
use sqlite_outbox::{Event, Outbox};
use test_ca::TestCa;

const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn https_goes_through_a_proxy_that_asks_for_credentials_and_a_407_spell_spends_nothing() {
    let ca = TestCa::new("office CA");
    let receiver = HttpsReceiver::start(&ca.server(), None);
    let proxy = ForwardProxy::start(Some("alice:s3cret"));
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("desktop.db"), "doc.saved", 10);
    let http = || HttpConfig::new().ca_pem(std::fs::read(ca.ca_pem()).unwrap());

    // A 407 spell: the proxy refuses everything for two seconds.
    proxy.state.refusing.store(true, Ordering::SeqCst);
    let handle = common::relay_over_http(
        &outbox,
        &receiver.url(),
        http().proxy(proxy.url(Some("alice:s3cret"))),
        2,
    );
    std::thread::sleep(Duration::from_secs(2));
    let rows = common::rows(&outbox);
    assert!(proxy.state.refused.load(Ordering::SeqCst) > 0);
    assert_eq!(rows.iter().map(|r| r.attempts).sum::<i64>(), 0, "{rows:?}");
    assert!(rows.iter().all(|r| !r.dead));
    assert!(
        rows.iter()
            .filter_map(|r| r.last_error.as_deref())
            .all(|e| e.starts_with("unreachable") && !e.contains("s3cret")),
        "{rows:?}"
    );
    // The spell ends: everything goes, through the tunnel, with the credentials.
    proxy.state.refusing.store(false, Ordering::SeqCst);
    assert!(common::all_delivered_within(&outbox, PATIENCE));
    let _ = handle.shutdown();
    assert_eq!(receiver.received(), 10);
    assert!(proxy.state.tunnels.load(Ordering::SeqCst) > 0);
    assert!(proxy
        .state
        .authorizations
        .lock()
        .unwrap()
        .iter()
        .all(|a| a == "Basic YWxpY2U6czNjcmV0"));
}

#[test]
fn plain_http_goes_through_the_proxy_in_absolute_form_with_its_credentials() {
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let proxy = ForwardProxy::start(Some("alice:s3cret"));
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("desktop.db"), "doc.saved", 6);
    // A 407 spell first: nothing spent, then everything goes.
    proxy.state.refusing.store(true, Ordering::SeqCst);
    let handle = common::relay_over_http(
        &outbox,
        &receiver.url(),
        HttpConfig::new().proxy(proxy.url(Some("alice:s3cret"))),
        2,
    );
    std::thread::sleep(Duration::from_secs(2));
    let rows = common::rows(&outbox);
    assert!(proxy.state.refused.load(Ordering::SeqCst) > 0);
    assert_eq!(rows.iter().map(|r| r.attempts).sum::<i64>(), 0, "{rows:?}");
    proxy.state.refusing.store(false, Ordering::SeqCst);
    assert!(common::all_delivered_within(&outbox, PATIENCE));
    let _ = handle.shutdown();
    assert_eq!(receiver.count(), 6);
    // Every request went in absolute form, none through a tunnel, each with the
    // credentials; the receiver got them in origin form, without the proxy's header.
    assert_eq!(proxy.state.tunnels.load(Ordering::SeqCst), 0);
    // Every request: the six events' and the relay's accounting of its stream.
    assert_eq!(
        proxy.state.forwarded.load(Ordering::SeqCst),
        6 + receiver.accountings().len()
    );
    let lines = proxy.state.request_lines.lock().unwrap().clone();
    let expected = format!("POST {}", receiver.url());
    assert!(lines.iter().all(|l| *l == expected), "{lines:?}");
    assert!(proxy
        .state
        .authorizations
        .lock()
        .unwrap()
        .iter()
        .all(|a| a == "Basic YWxpY2U6czNjcmV0"));
    assert!(receiver
        .received()
        .iter()
        .all(|r| !r.headers.contains_key("proxy-authorization")));
}

#[test]
fn wrong_proxy_credentials_spend_no_attempt() {
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let proxy = ForwardProxy::start(Some("alice:s3cret"));
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("desktop.db"), "doc.saved", 3);
    let handle = common::relay_over_http(
        &outbox,
        &receiver.url(),
        HttpConfig::new().proxy(proxy.url(Some("alice:wrong"))),
        2,
    );
    std::thread::sleep(Duration::from_secs(2));
    let _ = handle.shutdown();
    let rows = common::rows(&outbox);
    assert_eq!(receiver.count(), 0);
    assert_eq!(rows.iter().map(|r| r.attempts).sum::<i64>(), 0, "{rows:?}");
    assert!(rows.iter().all(|r| !r.dead && !r.delivered));
}

#[test]
fn the_cli_ignores_proxy_variables_unless_told_and_never_shows_the_password() {
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let proxy = ForwardProxy::start(Some("bob:hunter2"));
    let dir = tempfile::tempdir().unwrap();
    let outbox = common::outbox_with_events(&dir.path().join("desktop.db"), "doc.saved", 4);
    drop(outbox);
    let db = dir.path().join("desktop.db");
    let url = receiver.url();
    let proxy_url = proxy.url(Some("bob:hunter2"));
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let mut command = common::cli_command(
            &db,
            &["relay", "--url", &url, "--until-empty", "--timeout", "30s"],
        );
        command.args(extra).env("RUST_LOG", "debug");
        for (k, v) in env {
            command.env(k, v);
        }
        command.output().unwrap()
    };
    // The environment names a proxy that does not exist: without --proxy-from-env it is
    // ignored, and the events go straight to the receiver.
    let dead_proxy = format!("http://127.0.0.1:{}", common::closed_port());
    let o = run(
        &[],
        &[("http_proxy", &dead_proxy), ("ALL_PROXY", &dead_proxy)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(receiver.count(), 4);
    assert_eq!(proxy.state.tunnels.load(Ordering::SeqCst), 0);
    // Four more, through the proxy the environment names.
    let outbox = Outbox::open(&db).unwrap();
    outbox
        .transaction(|tx| {
            for i in 0..4 {
                let _ = outbox.enqueue(tx, Event::new("doc.saved", json!({"i": i})))?;
            }
            Ok::<_, sqlite_outbox::Error>(())
        })
        .unwrap();
    drop(outbox);
    let o = run(&["--proxy-from-env"], &[("http_proxy", &proxy_url)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert_eq!(receiver.count(), 8);
    assert!(proxy.state.forwarded.load(Ordering::SeqCst) > 0);
    assert!(!stderr.contains("hunter2"), "{stderr}");
    // A proxy URL that is not http:// is refused at start, without its password.
    let o = run(&["--proxy", "socks5://bob:hunter2@127.0.0.1:1"], &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not an http:// proxy URL") && !stderr.contains("hunter2"),
        "{stderr}"
    );
}

#[test]
fn no_proxy_ranges_send_loopback_straight_to_the_receiver() {
    // Issue 67, item 5: `no_proxy=localhost,127.0.0.0/8,::1` (curl matches ranges since
    // 7.86) and a proxy that would refuse everything; every event goes straight to the
    // receiver at 127.0.0.1, none to the proxy. Before, the range was read as a name, every
    // request went to the proxy and nothing was delivered.
    let receiver = TestReceiver::start(0, |_| Reply::Status(204));
    let dead_proxy = format!("http://127.0.0.1:{}", common::closed_port());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ranges.db");
    drop(common::outbox_with_events(&db, "doc.saved", 3));
    let o = common::cli_command(
        &db,
        &[
            "relay",
            "--url",
            &receiver.url(),
            "--proxy-from-env",
            "--until-empty",
            "--timeout",
            "15s",
        ],
    )
    .env("http_proxy", &dead_proxy)
    .env("no_proxy", "localhost,127.0.0.0/8,::1")
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(receiver.count(), 3);
}
