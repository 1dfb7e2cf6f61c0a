#[path = "../benches/support/mod.rs"]
mod support;
use sqlite_outbox::rusqlite::{params, TransactionBehavior};
use sqlite_outbox::Outbox;
use support::*;

const WHERE_CRATE: &str = "e.delivered_at IS NULL AND e.dead_at IS NULL AND e.destination = ?4 AND e.priority = ?8 AND e.available_at <= ?3
      AND (e.expires_at IS NULL OR e.expires_at > ?3) AND ((e.lease_expires_at IS NULL OR e.lease_expires_at <= ?3) OR e.leased_at > ?7)
      AND (e.partition_key IS NULL OR NOT EXISTS (
                 SELECT 1 FROM outbox_events AS k
                  WHERE k.partition_key = e.partition_key AND k.destination = e.destination
                    AND k.id < e.id AND k.delivered_at IS NULL AND k.dead_at IS NULL))";
const RET11: &str = "id, event_id, event_type, COALESCE(source, ?6), subject, partition_key,
               idempotency_key, payload, created_at, attempts, expires_at";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let variant = args[1].as_str();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.db");
    let outbox = Outbox::open(&path).unwrap();
    let n_rows: usize = std::env::var("N")
        .map(|v| v.parse().unwrap())
        .unwrap_or(20_000);
    fill_pending(&outbox, n_rows);
    if variant == "none" {
        return;
    }
    let mut conn = outbox.connection().unwrap();
    let ret = match variant {
        _ if variant != "crate1+select" && variant != "crate1+range" => RET11,
        "crate1+select" | "crate1+range" => "id",
        _ => panic!(),
    };
    let sql = format!(
        "UPDATE outbox_events SET lease_owner = ?1, lease_expires_at = ?2, leased_at = ?3 WHERE id IN (SELECT e.id FROM outbox_events AS e WHERE {WHERE_CRATE}
          ORDER BY e.available_at, e.id LIMIT CAST(?5 AS INTEGER)) RETURNING {ret}"
    );
    let far: i64 = 4_000_000_000_000_000;
    if variant == "ack-list-sp-mem" {
        conn.execute_batch("PRAGMA temp_store = MEMORY").unwrap();
    }
    let cpu = || -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let cpu0 = cpu();
    let t0 = std::time::Instant::now();
    let mut total = 0;
    let mut bytes = 0usize;
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let mut ids = Vec::new();
        {
            let mut stmt = tx.prepare_cached(&sql).unwrap();
            let n = stmt.parameter_count();
            let all: [&dyn sqlite_outbox::rusqlite::ToSql; 8] = [
                &"owner",
                &(far + 60_000),
                &far,
                &"default",
                &100i64,
                &"/bench",
                &(far + 5000),
                &5i64,
            ];
            let mut rows = stmt.query(&all[..n]).unwrap();
            while let Some(r) = rows.next().unwrap() {
                ids.push(r.get::<_, i64>(0).unwrap());
                for c in 1..r.as_ref().column_count() {
                    if let sqlite_outbox::rusqlite::types::ValueRef::Text(t) = r.get_ref(c).unwrap()
                    {
                        bytes += t.len();
                    }
                }
            }
        }
        if variant == "crate1+select" {
            let mut stmt = tx.prepare_cached("SELECT event_id, event_type, COALESCE(source, ?2), subject, partition_key,
               idempotency_key, payload, created_at, attempts, expires_at FROM outbox_events WHERE id = ?1").unwrap();
            stmt.raw_bind_parameter(2, "/bench").unwrap();
            for id in &ids {
                stmt.raw_bind_parameter(1, *id).unwrap();
                let mut rows = stmt.raw_query();
                let r = rows.next().unwrap().unwrap();
                for c in 0..10 {
                    if let sqlite_outbox::rusqlite::types::ValueRef::Text(t) = r.get_ref(c).unwrap()
                    {
                        bytes += t.len();
                    }
                }
            }
        }
        if variant == "crate1+range" && !ids.is_empty() {
            let (lo, hi) = (*ids.iter().min().unwrap(), *ids.iter().max().unwrap());
            let mut stmt = tx.prepare_cached("SELECT id, event_id, event_type, COALESCE(source, ?4), subject, partition_key,
               idempotency_key, payload, created_at, attempts, expires_at FROM outbox_events WHERE id BETWEEN ?1 AND ?2 AND lease_owner = ?3").unwrap();
            let mut rows = stmt.query(params![lo, hi, "owner", "/bench"]).unwrap();
            while let Some(r) = rows.next().unwrap() {
                for c in 1..11 {
                    if let sqlite_outbox::rusqlite::types::ValueRef::Text(t) = r.get_ref(c).unwrap()
                    {
                        bytes += t.len();
                    }
                }
            }
        }
        tx.commit().unwrap();
        if ids.is_empty() {
            break;
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        if variant == "ack-json" {
            let list = format!(
                "[{}]",
                ids.iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let n = tx
                .prepare_cached(
                    "UPDATE outbox_events
    SET delivered_at = ?3, last_attempted_at = ?3, attempts = attempts + 1,
        lease_owner = NULL, lease_expires_at = NULL
  WHERE id IN (SELECT value FROM json_each(?1)) AND lease_owner = ?2",
                )
                .unwrap()
                .execute(params![list, "owner", far])
                .unwrap();
            assert_eq!(n, ids.len());
            tx.commit().unwrap();
            total += ids.len();
            continue;
        }
        if variant.starts_with("ack-") && variant != "ack-json" {
            if variant.starts_with("ack-list-sp") {
                tx.execute_batch("SAVEPOINT ack").unwrap();
            }
            let marks: Vec<String> = (4..104).map(|i| format!("?{i}")).collect();
            let sql = format!(
                "UPDATE {}outbox_events
    SET delivered_at = ?3, last_attempted_at = ?3, attempts = attempts + 1,
        lease_owner = NULL, lease_expires_at = NULL
  WHERE id IN ({}) AND lease_owner = ?2",
                if variant.contains("fail") {
                    "OR FAIL "
                } else {
                    ""
                },
                marks.join(",")
            );
            let mut stmt = tx.prepare_cached(&sql).unwrap();
            stmt.raw_bind_parameter(2, "owner").unwrap();
            stmt.raw_bind_parameter(3, far).unwrap();
            for k in 0..100 {
                match ids.get(k) {
                    Some(id) => stmt.raw_bind_parameter(4 + k, *id).unwrap(),
                    None => stmt
                        .raw_bind_parameter(4 + k, sqlite_outbox::rusqlite::types::Null)
                        .unwrap(),
                }
            }
            if variant.ends_with("count") {
                let csql = format!("SELECT COUNT(*) FROM outbox_events WHERE id IN ({}) AND lease_owner = ?2 AND ?3 IS NOT NULL", marks.join(","));
                let mut c = tx.prepare_cached(&csql).unwrap();
                c.raw_bind_parameter(2, "owner").unwrap();
                c.raw_bind_parameter(3, far).unwrap();
                for k in 0..100 {
                    match ids.get(k) {
                        Some(id) => c.raw_bind_parameter(4 + k, *id).unwrap(),
                        None => c
                            .raw_bind_parameter(4 + k, sqlite_outbox::rusqlite::types::Null)
                            .unwrap(),
                    }
                }
                let mut rows = c.raw_query();
                let k: i64 = rows.next().unwrap().unwrap().get(0).unwrap();
                assert_eq!(k as usize, ids.len());
            }
            let n = if variant.ends_with("ret") {
                let rsql = format!("{sql} RETURNING id");
                let mut r = tx.prepare_cached(&rsql).unwrap();
                r.raw_bind_parameter(2, "owner").unwrap();
                r.raw_bind_parameter(3, far).unwrap();
                for k in 0..100 {
                    match ids.get(k) {
                        Some(id) => r.raw_bind_parameter(4 + k, *id).unwrap(),
                        None => r
                            .raw_bind_parameter(4 + k, sqlite_outbox::rusqlite::types::Null)
                            .unwrap(),
                    }
                }
                let mut rows = r.raw_query();
                let mut n = 0;
                while let Some(row) = rows.next().unwrap() {
                    let _: i64 = row.get(0).unwrap();
                    n += 1;
                }
                n
            } else {
                stmt.raw_execute().unwrap()
            };
            drop(stmt);
            assert_eq!(n, ids.len());
            if variant.starts_with("ack-list-sp") {
                tx.execute_batch("RELEASE ack").unwrap();
            }
            tx.commit().unwrap();
            total += ids.len();
            continue;
        }
        for id in &ids {
            tx.prepare_cached(
                "UPDATE outbox_events SET delivered_at = ?2, lease_owner = NULL,
                        lease_expires_at = NULL WHERE id = ?1 AND lease_owner = 'owner'",
            )
            .unwrap()
            .execute(params![*id, far])
            .unwrap();
        }
        tx.commit().unwrap();
        total += ids.len();
    }
    assert_eq!(total, n_rows);
    eprintln!(
        "{variant} {bytes} wall {:?} cpu {} ms",
        t0.elapsed(),
        (cpu() - cpu0) / 1_000_000
    );
}
