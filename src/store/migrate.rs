//! Embedded migrations, run under a lock, and the schema check done at connect.
//!
//! diesel_migrations takes no lock, and several processes migrating one database at once
//! race (`relation already exists`). So each backend serialises migrators: PostgreSQL with a
//! session advisory lock, MySQL with `GET_LOCK` on the database's name, SQLite with an
//! exclusive transaction. Migrations run on a dedicated synchronous connection in a blocking
//! thread (diesel's migration harness is synchronous and must not block an async runtime).

use diesel::connection::SimpleConnection;
use diesel::migration::MigrationSource;
use diesel::sqlite::SqliteConnection;
use diesel::Connection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::connect::{parse_url, Backend, Target};
use super::Store;
use crate::error::{Error, Result, StoreError};

const PG: EmbeddedMigrations = embed_migrations!("migrations/postgres");
const MYSQL: EmbeddedMigrations = embed_migrations!("migrations/mysql");
const SQLITE: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// Advisory lock key for migrations on PostgreSQL ("jobvisor" in ASCII, as a number).
const PG_LOCK_KEY: i64 = 0x6a6f_6276_6973_6f72;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn latest_version(source: &EmbeddedMigrations) -> String {
    MigrationSource::<diesel::pg::Pg>::migrations(source)
        .ok()
        .and_then(|ms| ms.iter().map(|m| m.name().version().to_string()).max())
        .unwrap_or_default()
}

impl Store {
    /// Applies every pending migration, safe when several processes do it at once.
    ///
    /// # Errors
    /// [`Error::Database`] when a migration fails (the message names it).
    pub async fn migrate(&self) -> Result<()> {
        let url = self.inner.url.clone();
        let busy_ms = self.inner.opts.busy_timeout.as_millis();
        let outcome = tokio::task::spawn_blocking(move || run_migrations(&url, busy_ms))
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
        latest_version(match self.inner.backend {
            Backend::Postgres => &PG,
            Backend::Mysql => &MYSQL,
            Backend::Sqlite => &SQLITE,
        })
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
        let q = "SELECT MAX(version) AS v FROM __diesel_schema_migrations";
        let found: std::result::Result<Vec<V>, diesel::result::Error> =
            super::connect::with_conn!(self, |conn| diesel::sql_query(q).load(conn).await);
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

fn is_missing_table(msg: &str) -> bool {
    msg.contains("does not exist") || msg.contains("doesn't exist") || msg.contains("no such table")
}

/// Runs the backend's migrations on a dedicated connection, holding its lock.
pub(crate) fn run_migrations(url: &str, busy_ms: u128) -> std::result::Result<(), BoxError> {
    match parse_url(url).map_err(|e| -> BoxError { e.to_string().into() })? {
        Target::Pg(u) => {
            let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::establish(&u)?;
            sync_exec(
                &mut conn,
                &format!("SELECT pg_advisory_lock({PG_LOCK_KEY})"),
            )?;
            let res = conn.run_pending_migrations(PG).map(|_| ());
            let unlock = sync_exec(
                &mut conn,
                &format!("SELECT pg_advisory_unlock({PG_LOCK_KEY})"),
            );
            res?;
            unlock?;
            Ok(())
        }
        Target::Mysql(u) => {
            let mut conn = AsyncConnectionWrapper::<AsyncMysqlConnection>::establish(&u)?;
            sync_exec(
                &mut conn,
                "SELECT GET_LOCK(CONCAT('jobvisor_migrate:', DATABASE()), 300)",
            )?;
            let res = conn.run_pending_migrations(MYSQL).map(|_| ());
            let unlock = sync_exec(
                &mut conn,
                "SELECT RELEASE_LOCK(CONCAT('jobvisor_migrate:', DATABASE()))",
            );
            res?;
            unlock?;
            Ok(())
        }
        Target::Sqlite(path) => {
            let mut conn = SqliteConnection::establish(&path.to_string_lossy())?;
            conn.batch_execute(&format!(
                "PRAGMA busy_timeout = {busy_ms}; PRAGMA journal_mode = WAL;"
            ))?;
            conn.exclusive_transaction(|c| -> std::result::Result<(), BoxError> {
                c.run_pending_migrations(SQLITE)?;
                Ok(())
            })
        }
    }
}

/// Runs one statement on a synchronous connection (the migration connection).
fn sync_exec<C>(conn: &mut C, sql: &str) -> diesel::QueryResult<usize>
where
    C: Connection,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>
        + diesel::query_dsl::methods::ExecuteDsl<C>,
{
    diesel::RunQueryDsl::execute(diesel::sql_query(sql), conn)
}
