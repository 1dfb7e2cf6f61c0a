//! The ingest's own PostgreSQL connection, on a thread of its own (`outbox-ingest-probe`):
//! once a second it checks PostgreSQL for `/healthz`, creates the tables while they are
//! missing, re-reads the table of device keys when it changed, and adds the refusals
//! counted since to `outbox_sources`.
//!
//! It once shared the database threads' queue with the stores: under load a revocation
//! waited seconds behind them, and a full queue made `/healthz` say 503, so a load
//! balancer would pull every instance because of one heavy sender. Now neither waits for
//! a store, and a busy queue is not an unhealthy database.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use sqlite_outbox::receive::PgTls;

use super::fleet_page::FleetSnapshot;
use super::keys::{Entry, Origin};
use super::server::{Health, State};
use super::store;

/// How often the probe checks PostgreSQL.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How often the table of device keys is read again though its change counter did not
/// move: a key revoked at a time in the future stops counting within this.
const KEYS_TABLE_REREAD: Duration = Duration::from_secs(30);
/// The longest a probe's statement may run: the probe must answer within seconds.
const PROBE_STATEMENT_TIMEOUT: &str = "5s";

/// The probe's thread, stopped and joined by [`stop`](Self::stop).
pub(crate) struct Probe {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Probe {
    /// Starts the probe; its first round runs at once (the keys table is read at start).
    pub fn start(
        config: postgres::Config,
        tls: PgTls,
        state: Arc<State>,
    ) -> std::io::Result<Probe> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("outbox-ingest-probe".into())
            .spawn(move || run(&config, &tls, &state, &stopped))?;
        Ok(Probe {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the probe after its current round (bounded by the connect and statement
    /// timeouts) and joins it.
    pub fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What one probe keeps between rounds.
#[derive(Default)]
struct Round {
    client: Option<postgres::Client>,
    migrated: bool,
    keys_seen: Option<(i64, Instant)>,
    /// When the fleet's view was last read.
    fleet_read: Option<Instant>,
}

fn run(config: &postgres::Config, tls: &PgTls, state: &State, stopped: &Receiver<()>) {
    let mut round = Round::default();
    loop {
        let health = round.probe(config, tls, state);
        state.set_health(health);
        match stopped.recv_timeout(PROBE_EVERY) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

impl Round {
    fn probe(&mut self, config: &postgres::Config, tls: &PgTls, state: &State) -> Health {
        match self.try_probe(config, tls, state) {
            Ok(health) => health,
            Err(e) => {
                // A broken connection is dropped; the next round connects again.
                self.client = None;
                Health::Unhealthy(e)
            }
        }
    }

    fn try_probe(
        &mut self,
        config: &postgres::Config,
        tls: &PgTls,
        state: &State,
    ) -> Result<Health, String> {
        if self.client.as_ref().is_none_or(postgres::Client::is_closed) {
            let mut client = config
                .connect(tls.clone())
                .map_err(|e| format!("PostgreSQL is unreachable: {e:#}"))?;
            client
                .batch_execute(&format!(
                    "SET statement_timeout = '{PROBE_STATEMENT_TIMEOUT}'"
                ))
                .map_err(|e| format!("PostgreSQL failed: {e:#}"))?;
            self.client = Some(client);
        }
        let Some(client) = self.client.as_mut() else {
            return Err("PostgreSQL is unreachable".into());
        };
        if !self.migrated {
            sqlite_outbox::receive::pg_migrate(client)
                .map_err(|e| format!("PostgreSQL is not ready: {e:#}"))?;
            self.migrated = true;
        }
        client
            .simple_query("SELECT 1")
            .map_err(|e| format!("PostgreSQL failed: {e:#}"))?;
        if state.keys_table {
            if let Err(e) = reload_keys_table(client, state, &mut self.keys_seen) {
                state.metrics.key_reload_failed();
                if !state.keys_table_loaded.load(Ordering::Acquire) {
                    return Err(format!(
                        "the table of device keys has not been read yet: {e:#}"
                    ));
                }
                log::error!(
                    "ingest: outbox_device_keys not re-read, the keys stay as they were: {e:#}"
                );
            }
        }
        // The log of the streams' numbers is merged every refresh, with or without a metrics
        // listener to show the view: it stays as short as a refresh's requests.
        if state.fleet.is_none()
            && self
                .fleet_read
                .is_none_or(|at| at.elapsed() >= state.fleet_refresh)
        {
            self.fleet_read = Some(Instant::now());
            if let Err(e) = crate::fleet::merge_log(client) {
                log::warn!("ingest: the streams' log not merged: {e:#}");
            }
        }
        if let Some(fleet) = &state.fleet {
            if self
                .fleet_read
                .is_none_or(|at| at.elapsed() >= state.fleet_refresh)
            {
                self.fleet_read = Some(Instant::now());
                match crate::fleet::read(client, None, crate::fleet::DEFAULT_SILENT_AFTER) {
                    Ok(views) => {
                        *super::lock(fleet) = FleetSnapshot {
                            views,
                            read_at: Some(crate::fleet::now_rfc3339()),
                            read_instant: Some(Instant::now()),
                        }
                    }
                    Err(e) => log::warn!("ingest: the fleet's view not read: {e:#}"),
                }
            }
        }
        let refusals = state.take_refusals();
        if !refusals.is_empty() {
            if let Err(e) = store::add_refusals(client, &refusals) {
                log::warn!("ingest: refusals not added to outbox_sources: {e:#}");
            }
        }
        Ok(Health::Healthy)
    }
}

/// Re-reads `outbox_device_keys` when its change counter moved or it was read long ago.
fn reload_keys_table(
    client: &mut postgres::Client,
    state: &State,
    seen: &mut Option<(i64, Instant)>,
) -> Result<(), postgres::Error> {
    let changes = store::keys_changes(client)?;
    if seen.is_some_and(|(at, when)| at == changes && when.elapsed() < KEYS_TABLE_REREAD) {
        return Ok(());
    }
    let (changes, rows) = store::load_keys(client)?;
    let mut entries = Vec::with_capacity(rows.len());
    for (key_id, pattern, key) in rows {
        match Entry::parse(&key_id, &pattern, &key) {
            Ok(entry) => entries.push(entry),
            Err(why) => log::error!(
                "ingest: outbox_device_keys: {}; that row is skipped",
                super::loggable(&why)
            ),
        }
    }
    let loaded = entries.len();
    let total = state.keys.replace(Origin::Table, entries);
    state.keys_table_loaded.store(true, Ordering::Release);
    state.metrics.key_reload_succeeded();
    if seen.is_none_or(|(at, _)| at != changes) {
        log::info!("ingest: {loaded} keys from outbox_device_keys ({total} in all)");
    }
    *seen = Some((changes, Instant::now()));
    Ok(())
}
