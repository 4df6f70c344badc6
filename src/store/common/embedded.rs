//! The embedded-migration helpers every backend uses, below the backends: the latest version
//! a build embeds, the run loop that records jobvisor's migrations in a table of their own
//! ([`MIGRATIONS_TABLE`]), and the one locked-migrate routine of the network backends (lock,
//! run, unlock). `migrate.rs`, above the seam, decides when to migrate and checks the schema.
//!
//! diesel_migrations' harness records every migration in `__diesel_schema_migrations`, the
//! table an application's own diesel migrations use too: the two sets of versions mixed (an
//! application's newer version passed the schema check of a database jobvisor never
//! migrated; an application's `diesel migration revert` met jobvisor's versions). So
//! jobvisor runs its embedded migrations itself, as diesel's harness does (each in a
//! transaction unless it opts out), and records them in its own table. A database migrated
//! before has its jobvisor rows moved out of diesel's table once, under the migration lock.

use diesel::migration::MigrationSource;
use diesel::query_builder::{QueryFragment, SqlQuery};
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::{Connection, RunQueryDsl};
use diesel_migrations::EmbeddedMigrations;

/// The table jobvisor records its applied migrations in (one row per version, as diesel's
/// `__diesel_schema_migrations`; an application's own diesel migrations stay in that one).
pub(crate) const MIGRATIONS_TABLE: &str = "jobvisor_schema_migrations";

/// diesel's default table, where jobvisor recorded its migrations before
/// [`MIGRATIONS_TABLE`].
const DIESEL_TABLE: &str = "__diesel_schema_migrations";

/// An error of the migration harness.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The latest version in `source`, read as backend `DB`'s migrations.
pub(crate) fn latest_version<DB: diesel::backend::Backend>(source: &EmbeddedMigrations) -> String
where
    EmbeddedMigrations: MigrationSource<DB>,
{
    MigrationSource::<DB>::migrations(source)
        .ok()
        .and_then(|ms| ms.iter().map(|m| m.name().version().to_string()).max())
        .unwrap_or_default()
}

/// Runs `source`'s pending migrations on `conn` (a dedicated synchronous connection) between
/// the statements `lock` and `unlock`: diesel_migrations takes no lock, and several processes
/// migrating one database at once would race. The lock is released even when a migration
/// fails; the migration's error wins over the unlock's.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn migrate_locked<C, S>(
    conn: &mut C,
    lock: &str,
    unlock: &str,
    source: S,
) -> Result<(), BoxError>
where
    C: Connection + 'static,
    S: MigrationSource<C::Backend>,
    SqlQuery: QueryFragment<C::Backend> + ExecuteDsl<C> + for<'a> LoadQuery<'a, C, VersionRow>,
{
    diesel::RunQueryDsl::execute(diesel::sql_query(lock), conn)?;
    let res = run_pending(conn, source);
    let unlocked = diesel::RunQueryDsl::execute(diesel::sql_query(unlock), conn);
    res?;
    unlocked?;
    Ok(())
}

/// A version read from a migrations table.
#[derive(diesel::QueryableByName)]
pub(crate) struct VersionRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

/// Runs `source`'s migrations not yet recorded in [`MIGRATIONS_TABLE`], oldest first, each
/// recorded there in the same transaction as its statements (unless it opts out of one, as
/// with diesel's harness). The caller holds the migration lock: the table's creation and the
/// one-time move of jobvisor's rows out of diesel's table run under it.
pub(crate) fn run_pending<C, S>(conn: &mut C, source: S) -> Result<(), BoxError>
where
    C: Connection + 'static,
    S: MigrationSource<C::Backend>,
    SqlQuery: QueryFragment<C::Backend> + ExecuteDsl<C> + for<'a> LoadQuery<'a, C, VersionRow>,
{
    let mut migrations = source.migrations()?;
    migrations.sort_by_key(|m| m.name().version().to_string());
    let ours: Vec<String> = migrations
        .iter()
        .map(|m| m.name().version().to_string())
        .collect();
    // Versions are spliced into the statements below: only digits (diesel's versions are
    // the folder names' timestamps without their dashes).
    if let Some(bad) = ours
        .iter()
        .find(|v| v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("embedded migration version {bad:?} is not all digits").into());
    }
    diesel::sql_query(format!(
        "CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (\
         version VARCHAR(50) PRIMARY KEY NOT NULL, \
         run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)"
    ))
    .execute(conn)?;
    let mut applied = versions(conn, MIGRATIONS_TABLE)?;
    if applied.is_empty() {
        applied = move_from_diesel_table(conn, &ours)?;
    }
    for m in migrations {
        let version = m.name().version().to_string();
        if applied.contains(&version) {
            continue;
        }
        let apply = |c: &mut C| -> Result<(), BoxError> {
            m.run(c)?;
            diesel::sql_query(format!(
                "INSERT INTO {MIGRATIONS_TABLE} (version) VALUES ('{version}')"
            ))
            .execute(c)?;
            Ok(())
        };
        if m.metadata().run_in_transaction() {
            conn.transaction(apply)?;
        } else {
            apply(conn)?;
        }
    }
    Ok(())
}

/// The versions recorded in `table`.
fn versions<C>(conn: &mut C, table: &str) -> Result<Vec<String>, diesel::result::Error>
where
    C: Connection,
    SqlQuery: for<'a> LoadQuery<'a, C, VersionRow>,
{
    let rows: Vec<VersionRow> =
        diesel::sql_query(format!("SELECT version FROM {table}")).load(conn)?;
    Ok(rows.into_iter().map(|r| r.version).collect())
}

/// A database migrated by an earlier build has jobvisor's versions in diesel's table: moves
/// them (with their `run_on`) into [`MIGRATIONS_TABLE`], in one transaction, and answers the
/// versions moved. An application's own rows there are left alone. Runs only while
/// jobvisor's table is empty, under the migration lock: once.
fn move_from_diesel_table<C>(conn: &mut C, ours: &[String]) -> Result<Vec<String>, BoxError>
where
    C: Connection,
    SqlQuery: QueryFragment<C::Backend> + ExecuteDsl<C> + for<'a> LoadQuery<'a, C, VersionRow>,
{
    let found = match versions(conn, DIESEL_TABLE) {
        Ok(v) => v,
        // No such table: a fresh database, or one only jobvisor ever migrated anew.
        Err(diesel::result::Error::DatabaseError(_, info)) if is_missing_table(info.message()) => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e.into()),
    };
    let moved: Vec<String> = found.into_iter().filter(|v| ours.contains(v)).collect();
    if moved.is_empty() {
        return Ok(moved);
    }
    let list = moved
        .iter()
        .map(|v| format!("'{v}'"))
        .collect::<Vec<_>>()
        .join(", ");
    conn.transaction(|c| -> Result<(), diesel::result::Error> {
        diesel::sql_query(format!(
            "INSERT INTO {MIGRATIONS_TABLE} (version, run_on) \
             SELECT version, run_on FROM {DIESEL_TABLE} WHERE version IN ({list})"
        ))
        .execute(c)?;
        diesel::sql_query(format!(
            "DELETE FROM {DIESEL_TABLE} WHERE version IN ({list})"
        ))
        .execute(c)?;
        Ok(())
    })?;
    Ok(moved)
}

/// A backend's "no such table" error, by its message (the three backends' wordings).
pub(crate) fn is_missing_table(msg: &str) -> bool {
    msg.contains("does not exist") || msg.contains("doesn't exist") || msg.contains("no such table")
}
