//! Changing the settings kept in the file through an [`Outbox`]: the methods
//! [`Outbox::settings`], [`Outbox::set_setting`] and [`Outbox::unset_setting`]. Apart from
//! [`settings`](crate::settings), which only reads, checks and writes the rows, so that the
//! outbox can follow them without the module that changes them importing it back.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::outbox::Outbox;
use crate::store::limits;
use crate::store::settings::{load_rows, set, unset, Settings};

impl Outbox {
    /// The settings kept in the file, key → value as stored (see [`settings`](crate::settings)
    /// for the keys). Keys not stored take their defaults.
    ///
    /// # Errors
    ///
    /// SQLite errors.
    pub fn settings(&self) -> Result<BTreeMap<String, String>> {
        let conn = self.connection()?;
        load_rows(&conn)
    }

    /// Checks `value` for `key` and stores it; returns the value as stored (routes as a JSON
    /// array, lifetimes in milliseconds). Every writer follows it: this process at once,
    /// other processes' outboxes within a quarter second, the SQL contract on its next
    /// insert. A storage limit installs the triggers that keep the pending totals; a policy
    /// is applied to the pending events too.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting) for an unknown key or a value out of range (nothing is
    /// written), SQLite errors.
    pub fn set_setting(&self, key: &str, value: &str) -> Result<String> {
        let mut conn = self.connection()?;
        let stored = {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let stored = set(&tx, key, value)?;
            tx.commit()?;
            stored
        };
        let settings = Settings::from_rows(&load_rows(&conn)?);
        if settings.limits.is_set() {
            limits::ensure_totals(&mut conn)?;
        }
        if key.starts_with("policy:") {
            settings.limits.mark_pending(&mut conn)?;
        }
        self.refresh_settings();
        Ok(stored)
    }

    /// Removes the setting `key` (it takes its default again); returns whether it was set.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting) for an unknown key, SQLite errors.
    pub fn unset_setting(&self, key: &str) -> Result<bool> {
        let mut conn = self.connection()?;
        let was = unset(&conn, key)?;
        if key.starts_with("policy:") {
            Settings::from_rows(&load_rows(&conn)?)
                .limits
                .mark_pending(&mut conn)?;
        }
        self.refresh_settings();
        Ok(was)
    }
}
