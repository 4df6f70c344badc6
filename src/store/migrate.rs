//! Embedded migrations, run under a lock, and the schema check done at connect.
//!
//! diesel_migrations takes no lock, and several processes migrating one database at once
//! race (`relation already exists`). So each backend serialises migrators: PostgreSQL with a
//! session advisory lock, MySQL with `GET_LOCK` on the database's name, SQLite with an
//! exclusive transaction. Migrations run on a dedicated synchronous connection in a blocking
//! thread (diesel's migrations are synchronous and must not block an async runtime), and are
//! recorded in jobvisor's own table, `jobvisor_schema_migrations` (see `embedded.rs`): the
//! schema check reads only jobvisor's versions, never an application's diesel migrations.

use super::connect::parse_url;
use super::driver::{latest_migration, run_migrations};
use super::embedded::{is_missing_table, MIGRATIONS_TABLE};
use super::Store;
use crate::error::{Error, Result, StoreError};

impl Store {
    /// Applies every pending migration, safe when several processes do it at once.
    ///
    /// # Errors
    /// [`Error::Database`] when a migration fails (the message names it).
    pub async fn migrate(&self) -> Result<()> {
        let (_, target) = parse_url(&self.inner.url)?;
        let busy_ms = self.inner.opts.busy_timeout.as_millis();
        let conn = self
            .inner
            .driver
            .migration_conn()
            .await
            .map_err(|reason| Error::Connect {
                url: self.inner.url_redacted.clone(),
                reason,
            })?;
        let outcome = tokio::task::spawn_blocking(move || run_migrations(conn, &target, busy_ms))
            .await
            .map_err(|e| Error::Database(StoreError::Other(format!("migration task: {e}"))))?;
        outcome.map_err(|e| {
            Error::Database(StoreError::Other(format!(
                "migrating {}: {e}",
                self.inner.url_redacted
            )))
        })
    }

    /// The latest migration version this build embeds for the store's backend.
    pub fn schema_version_expected(&self) -> String {
        latest_migration(self.backend())
    }

    /// The latest migration version applied to the database, or `None` on a database that
    /// was never migrated.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn schema_version_applied(&self) -> Result<Option<String>> {
        use diesel::sql_types::Text;
        use diesel_async::RunQueryDsl;

        #[derive(diesel::QueryableByName)]
        struct V {
            #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
            v: Option<String>,
        }
        let q = format!("SELECT MAX(version) AS v FROM {MIGRATIONS_TABLE}");
        let found: std::result::Result<Vec<V>, diesel::result::Error> =
            super::driver::with_conn!(self, |conn| diesel::sql_query(&q).load(conn).await);
        match found {
            Ok(rows) => Ok(rows.into_iter().next().and_then(|r| r.v)),
            Err(diesel::result::Error::DatabaseError(_, info))
                if is_missing_table(info.message()) =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Fails with [`Error::SchemaOutOfDate`] unless every embedded migration is applied.
    pub(crate) async fn check_schema(&self) -> Result<()> {
        use diesel::sql_types::Text;
        use diesel_async::RunQueryDsl;

        #[derive(diesel::QueryableByName)]
        struct V {
            #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
            v: Option<String>,
        }
        let expected = self.schema_version_expected();
        let q = format!("SELECT MAX(version) AS v FROM {MIGRATIONS_TABLE}");
        let found: std::result::Result<Vec<V>, diesel::result::Error> =
            super::driver::with_conn!(self, |conn| diesel::sql_query(&q).load(conn).await);
        let found = match found {
            Ok(rows) => rows.into_iter().next().and_then(|r| r.v),
            Err(diesel::result::Error::DatabaseError(_, info))
                if is_missing_table(info.message()) =>
            {
                None
            }
            Err(e) => return Err(e.into()),
        };
        match found {
            Some(v) if v >= expected => Ok(()),
            other => Err(Error::SchemaOutOfDate {
                expected,
                found: match other {
                    Some(v) => format!("at version {v}"),
                    None => "missing".to_string(),
                },
                url: self.inner.url_redacted.clone(),
            }),
        }
    }
}
