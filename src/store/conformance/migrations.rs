//! Conformance cases for jobvisor's migration records: they live in `jobvisor_schema_migrations`,
//! apart from an application's own diesel migrations in `__diesel_schema_migrations` — an
//! application's newer version there fools no schema check and is never touched — and a
//! database migrated by an earlier build has its rows moved out of diesel's table once, even
//! under concurrent starts.

use super::*;

/// The versions in `table` matching `filter` (an SQL condition), sorted.
async fn versions(store: &Store, table: &str, filter: &str) -> crate::error::Result<Vec<String>> {
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct V {
        #[diesel(sql_type = diesel::sql_types::Text)]
        version: String,
    }
    let q = format!("SELECT version FROM {table} WHERE {filter} ORDER BY version");
    let rows: Vec<V> =
        super::super::driver::with_conn!(store, |conn| diesel::sql_query(&q).load(conn).await)?;
    Ok(rows.into_iter().map(|r| r.version).collect())
}

/// An application's diesel migrations: diesel's table with a version newer than jobvisor's,
/// and the application's own table.
const APP_MIGRATIONS: [&str; 3] = [
    "CREATE TABLE __diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY NOT NULL, \
     run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
    "INSERT INTO __diesel_schema_migrations (version) VALUES ('20270115093000')",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY NOT NULL, total INTEGER NOT NULL)",
];

pub async fn an_applications_diesel_migrations_fool_no_schema_check_and_are_left_alone(b: Backend) {
    let db = TestDb::create(b).await;
    // The application migrated first: its tables only, none of jobvisor's.
    let bare = Store::open(&db.url, StoreOptions::default()).await.unwrap();
    for sql in APP_MIGRATIONS {
        exec_sql(&bare, sql).await.unwrap();
    }
    let e = Store::connect(&db.url).await.unwrap_err();
    assert!(
        matches!(&e, Error::SchemaOutOfDate { found, .. } if found == "missing"),
        "[{b:?}] an application's newer version is not jobvisor's: {e}"
    );
    assert_eq!(bare.schema_version_applied().await.unwrap(), None);

    let store = db.store().await;
    assert_eq!(
        store.schema_version_applied().await.unwrap(),
        Some(store.schema_version_expected())
    );
    Store::connect(&db.url).await.unwrap();
    assert_eq!(
        versions(&store, "__diesel_schema_migrations", "1 = 1")
            .await
            .unwrap(),
        vec!["20270115093000".to_string()],
        "[{b:?}] diesel's table holds the application's version only"
    );
    exec_sql(&store, "INSERT INTO orders (id, total) VALUES (1, 42)")
        .await
        .unwrap();
    // Migrating again changes nothing of either.
    store.migrate().await.unwrap();
    assert_eq!(
        versions(&store, "__diesel_schema_migrations", "1 = 1")
            .await
            .unwrap()
            .len(),
        1
    );
}

pub async fn rows_in_diesels_table_move_once_under_concurrent_starts(b: Backend) {
    let db = TestDb::create(b).await;
    let store = db.store().await;
    let ours = versions(&store, "jobvisor_schema_migrations", "1 = 1")
        .await
        .unwrap();
    assert!(ours.len() > 10, "{ours:?}");
    // The layout an earlier build left: jobvisor's versions in diesel's table (run long
    // ago), beside an application's own, and no table of jobvisor's.
    for sql in [
        APP_MIGRATIONS[0],
        APP_MIGRATIONS[1],
        "INSERT INTO __diesel_schema_migrations (version, run_on) \
         SELECT version, '2001-02-03 04:05:06' FROM jobvisor_schema_migrations",
        "DROP TABLE jobvisor_schema_migrations",
    ] {
        exec_sql(&store, sql).await.unwrap();
    }
    let e = Store::connect(&db.url).await.unwrap_err();
    assert!(matches!(e, Error::SchemaOutOfDate { .. }), "{e}");

    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(async move {
            Store::connect_with(&url, StoreOptions::default().migrate(true))
                .await
                .map(|_| ())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    // Moved, with their times, not run again (a second run would have failed on the
    // existing tables; a second move would have found nothing to move).
    assert_eq!(
        versions(
            &store,
            "jobvisor_schema_migrations",
            "run_on < '2002-01-01 00:00:00'"
        )
        .await
        .unwrap(),
        ours,
        "[{b:?}]"
    );
    assert_eq!(
        versions(&store, "jobvisor_schema_migrations", "1 = 1")
            .await
            .unwrap(),
        ours
    );
    assert_eq!(
        versions(&store, "__diesel_schema_migrations", "1 = 1")
            .await
            .unwrap(),
        vec!["20270115093000".to_string()],
        "[{b:?}] the application's row stays, jobvisor's are gone"
    );
    let store = Store::connect(&db.url).await.unwrap();
    store
        .job_enqueue(NewJob::new("k", json!({})), None)
        .await
        .unwrap();
}
