//! What reading the fleet's view costs as the events stored grow (issue 65, item 5): 10,000
//! streams (sources `/devices/{i}`, stream `fleet`, each with a report and one number
//! missing), with 1 million, then 10 million events stored, on a PostgreSQL cluster of the
//! bench's own. For each size: the time of `outbox fleet --json`'s work (the view read from
//! the streams' summaries and printed as JSON) and of one refresh of `/fleet` and the gauges
//! (the same read), medians of 5; the same view read the way it was read before migration 7
//! (a window over every stored number); and the time migration 7 takes to build the
//! summaries from that many events. The rows of docs/PERFORMANCE.md's fleet section.
//!
//! ```text
//! cargo run --release -p outbox-cli --example bench_fleet            # 1M and 10M
//! cargo run --release -p outbox-cli --example bench_fleet -- 100000  # a quick look
//! ```

#[path = "../../tests/common/postgres.rs"]
mod support_postgres;

use std::time::{Duration, Instant};

use outbox_cli::fleet;

const STREAMS: i64 = 10_000;

/// The view as `outbox fleet` read it before migration 7: every stored number, ranked.
const BEFORE_7: &str = "
    SELECT source, stream, min(stream_seq), max(stream_seq)
      FROM (SELECT source, stream, stream_seq,
                   stream_seq - dense_rank() OVER (PARTITION BY source, stream
                                                   ORDER BY stream_seq) AS island
              FROM (SELECT DISTINCT source, stream, stream_seq FROM outbox_ingested
                     WHERE stream_seq IS NOT NULL AND stream IS NOT NULL) AS numbers) AS ranked
     GROUP BY source, stream, island";

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Adds events until `total` are stored: each stream's numbers from where it stopped, the
/// fifth number of every stream never stored (missing).
fn fill(client: &mut postgres::Client, stored: i64, total: i64) {
    let per_stream_from = stored / STREAMS;
    let per_stream_to = total / STREAMS;
    client
        .execute(
            "INSERT INTO outbox_ingested (source, id, type, data, stream, stream_seq)
             SELECT '/devices/' || s, s || '-' || n, 'reading.taken',
                    jsonb_build_object('n', n), 'fleet', n
               FROM generate_series(1, $1::int8) AS s,
                    generate_series($2::int8 + 1, $3::int8) AS n
              WHERE n <> 5",
            &[&STREAMS, &per_stream_from, &per_stream_to],
        )
        .expect("events stored");
    client
        .execute(
            "INSERT INTO outbox_stream_reports (source, stream, high_water, pending, accounted)
             SELECT '/devices/' || s, 'fleet', $2::int8, '[]', '{\"dead\": [[3, 3]]}'
               FROM generate_series(1, $1::int8) AS s
             ON CONFLICT (source, stream) DO UPDATE SET high_water = EXCLUDED.high_water",
            &[&STREAMS, &per_stream_to],
        )
        .expect("reports stored");
    client.batch_execute("VACUUM ANALYZE").expect("vacuum");
}

/// Drops the summaries and runs migration 7 again, as on a database of the last release
/// holding these events: how long it takes.
fn rebuild(client: &mut postgres::Client) -> Duration {
    client
        .batch_execute(
            "DROP TABLE outbox_fleet_streams, outbox_fleet_log;
             ALTER TABLE outbox_stream_reports DROP COLUMN report_seq;
             DELETE FROM outbox_pg_migrations WHERE version = 7;",
        )
        .expect("back to version 6");
    let started = Instant::now();
    sqlite_outbox::receive::pg_migrate(client).expect("migration 7");
    started.elapsed()
}

fn main() {
    if !std::path::Path::new("/usr/lib/postgresql").exists() {
        eprintln!("PostgreSQL is not installed: no fleet rows");
        std::process::exit(1);
    }
    let sizes: Vec<i64> = match std::env::args().nth(1) {
        Some(n) => vec![n.parse().expect("a number of events")],
        None => vec![1_000_000, 10_000_000],
    };
    let postgres = support_postgres::Postgres::start();
    let mut client = postgres.client();
    sqlite_outbox::receive::pg_migrate(&mut client).expect("the tables");
    println!("| events stored ({STREAMS} streams) | `outbox fleet --json` | one refresh of /fleet | before migration 7 (window over every number) | migration 7 |");
    println!("|---|---|---|---|---|");
    let mut stored = 0;
    let mut firsts = Vec::new();
    for total in sizes {
        fill(&mut client, stored, total);
        stored = total;
        let migration = rebuild(&mut client);
        let mut cli = Vec::new();
        let mut refresh = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let views =
                fleet::read(&mut client, None, fleet::DEFAULT_SILENT_AFTER).expect("the view");
            let json = serde_json::to_string_pretty(&views).expect("JSON");
            cli.push(started.elapsed());
            assert_eq!(views.len() as i64, STREAMS);
            assert!(
                views.iter().all(|v| v.missing == vec![[5, 5]]),
                "{json:.300}"
            );
            let started = Instant::now();
            let views =
                fleet::read(&mut client, None, fleet::DEFAULT_SILENT_AFTER).expect("the view");
            refresh.push(started.elapsed());
            drop(views);
        }
        let started = Instant::now();
        let ranges = client.query(BEFORE_7, &[]).expect("the old view").len();
        let before = started.elapsed();
        assert_eq!(ranges as i64, 2 * STREAMS);
        let (cli, refresh) = (median(cli), median(refresh));
        firsts.push((cli, refresh, before));
        println!(
            "| {total} | {} | {} | {} | {:.1} s |",
            ms(cli),
            ms(refresh),
            ms(before),
            migration.as_secs_f64()
        );
    }
    if let [(cli_1, refresh_1, before_1), .., (cli_n, refresh_n, before_n)] = firsts[..] {
        println!(
            "\ngrowth from the first size to the last: outbox fleet {:.2}×, refresh {:.2}×, before migration 7 {:.2}×",
            cli_n.as_secs_f64() / cli_1.as_secs_f64(),
            refresh_n.as_secs_f64() / refresh_1.as_secs_f64(),
            before_n.as_secs_f64() / before_1.as_secs_f64()
        );
    }
}
