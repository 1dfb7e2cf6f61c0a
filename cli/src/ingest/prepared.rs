//! The database threads' pooled connections, each with the statements it prepared: a
//! request's store runs a statement prepared once per connection, not parsed and planned
//! again for every request (the store statement, with its CTEs for the sources and the
//! streams' log, cost a one-event request about a third of its time to prepare).

use std::collections::HashMap;

use r2d2_postgres::PostgresConnectionManager;
use sqlite_outbox::receive::PgTls;

/// A pooled connection and the statements prepared on it, by their text.
pub(crate) struct Connection {
    pub client: postgres::Client,
    statements: HashMap<&'static str, postgres::Statement>,
}

impl Connection {
    /// `sql` prepared on this connection, once.
    pub fn prepared(&mut self, sql: &'static str) -> Result<postgres::Statement, postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }
}

/// r2d2's manager of [`Connection`]s: `r2d2_postgres`'s, with the statements kept.
pub(crate) struct Manager(pub PostgresConnectionManager<PgTls>);

impl r2d2::ManageConnection for Manager {
    type Connection = Connection;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Connection, postgres::Error> {
        Ok(Connection {
            client: self.0.connect()?,
            statements: HashMap::new(),
        })
    }

    fn is_valid(&self, conn: &mut Connection) -> Result<(), postgres::Error> {
        self.0.is_valid(&mut conn.client)
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        self.0.has_broken(&mut conn.client)
    }
}
