//! TLS between the ingest (and `receive::pg_connect` users) and PostgreSQL, with libpq's
//! `sslmode` and `sslrootcert`: a real cluster with `ssl = on` and a certificate from a CA
//! made by the test. `verify-full` connects with the right CA and host name and is refused
//! with a wrong CA or name; `require` never falls back to plaintext.

#[path = "../../tests/common/postgres.rs"]
mod pg;
#[path = "../../tests/common/raw_http.rs"]
mod raw_http;
#[path = "../../tests/common/test_ca.rs"]
mod test_ca;

use outbox_cli::ingest::{IngestConfig, IngestServer};
use pg::Postgres;
use raw_http::{request, signed_headers};
use serde_json::json;
use sqlite_outbox::receive::{pg_connect, Secret};
use test_ca::TestCa;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Posts one signed event; the answer's status.
fn post(server: &IngestServer, id: &str) -> u16 {
    let body = json!({"specversion": "1.0", "id": id, "source": "/d", "type": "t"}).to_string();
    let headers = signed_headers(
        &Secret::parse(SECRET).unwrap(),
        id,
        body.as_bytes(),
        "application/cloudevents+json",
    );
    request(
        server.local_addr(),
        "POST",
        "/events",
        &headers,
        body.as_bytes(),
    )
    .unwrap()
    .status
}

fn ingest(url: String) -> IngestServer {
    IngestServer::start(
        IngestConfig::new("127.0.0.1:0".parse().unwrap(), url)
            .secret(Secret::parse(SECRET).unwrap()),
    )
    .unwrap()
}

#[test]
fn verify_full_stores_over_tls_and_a_wrong_ca_or_name_never_connects() {
    let ca = TestCa::new("test ca");
    let server_cert = ca.server();
    let mut postgres = Postgres::start();
    postgres.enable_tls(&server_cert.cert, &server_cert.key);
    let ca_pem = ca.ca_pem();
    let full = format!(
        "{} sslmode=verify-full sslrootcert={}",
        postgres.url(),
        ca_pem.display()
    );

    let server = ingest(full.clone());
    assert_eq!(post(&server, "tls-1"), 204);
    // The ingest's own sessions are encrypted.
    let encrypted: i64 = pg_connect(&full)
        .unwrap()
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
              WHERE ssl AND application_name = 'outbox-ingest'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(encrypted >= 1, "the ingest's connection is TLS");
    server.shutdown();

    // Another CA: the certificate does not check out; nothing is stored, 503 every time.
    let other = TestCa::new("other ca");
    let wrong_ca = format!(
        "{} sslmode=verify-full sslrootcert={}",
        postgres.url(),
        other.ca_pem().display()
    );
    assert!(pg_connect(&wrong_ca).is_err());
    let server = ingest(wrong_ca);
    assert_eq!(post(&server, "tls-2"), 503);
    let health = request(server.local_addr(), "GET", "/healthz", &[], b"").unwrap();
    assert_eq!(health.status, 503);
    server.shutdown();

    // A certificate for another name: verify-full refuses it, verify-ca takes it.
    let elsewhere = ca.server_for("elsewhere", &["db.example.com"]);
    postgres.enable_tls(&elsewhere.cert, &elsewhere.key);
    assert!(pg_connect(&full).is_err(), "the host name is checked");
    let ca_only = full.replace("verify-full", "verify-ca");
    assert!(
        pg_connect(&ca_only).is_ok(),
        "verify-ca checks the chain only"
    );

    let stored: i64 = postgres
        .client()
        .query_one("SELECT count(*) FROM outbox_ingested", &[])
        .unwrap()
        .get(0);
    assert_eq!(stored, 1);
}

#[test]
fn require_refuses_a_server_without_tls_and_prefer_uses_tls_when_offered() {
    let plain = Postgres::start();
    let require = format!("{} sslmode=require", plain.url());
    assert!(pg_connect(&require).is_err(), "no plaintext fallback");
    let server = ingest(require);
    assert_eq!(post(&server, "plain-1"), 503);
    server.shutdown();
    // prefer, like libpq's default, connects without TLS when the server has none.
    assert!(pg_connect(&format!("{} sslmode=prefer", plain.url())).is_ok());

    let ca = TestCa::new("test ca");
    let cert = ca.server();
    let mut tls = Postgres::start();
    tls.enable_tls(&cert.cert, &cert.key);
    let mut client = pg_connect(&tls.url()).unwrap();
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        ssl,
        "the default (prefer) encrypts when the server offers TLS"
    );
}
