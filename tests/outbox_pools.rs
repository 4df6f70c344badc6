//! `Client::enqueue_in` on connections checked out of the application's own pools — bb8 and
//! (feature `deadpool`) deadpool, as diesel-async builds them — on every backend, inside the
//! caller's transaction and outside it; and a connection to another kind of database than
//! the store's is refused by name, with nothing written.

#![allow(clippy::unwrap_used)]

use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection};
use jobvisor::testing::TestDb;
use jobvisor::{Backend, Client, Error, JobState, NewJob, OutboxConnection};
use serde_json::json;

type SqliteConn = SyncConnectionWrapper<diesel::sqlite::SqliteConnection>;

/// Enqueues one job on `conn` (autocommit) and one inside a transaction that commits, then
/// checks the client sees both.
async fn enqueue_through<C>(client: &Client, conn: &mut C, tag: &str)
where
    C: OutboxConnection,
{
    let got = client
        .enqueue_in(conn, vec![NewJob::new("pooled", json!({ "via": tag }))])
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let job = client.get(got[0].id).await.unwrap();
    assert_eq!(
        (job.state, job.payload),
        (JobState::Pending, json!({ "via": tag }))
    );
}

/// The connection URL diesel-async's own `establish` takes for a test database.
fn diesel_url(db: &TestDb) -> String {
    match db.backend {
        Backend::Sqlite => db.url.trim_start_matches("sqlite://").to_string(),
        _ => db.url.clone(),
    }
}

async fn pooled_connections_enqueue(backend: Backend) {
    let db = TestDb::create(backend).await;
    let client = Client::new(db.store().await);
    let url = diesel_url(&db);
    macro_rules! with_pools {
        ($conn:ty) => {{
            let bb8 = diesel_async::pooled_connection::bb8::Pool::builder()
                .max_size(2)
                .build(AsyncDieselConnectionManager::<$conn>::new(url.clone()))
                .await
                .unwrap();
            let mut c = bb8.get().await.unwrap();
            enqueue_through(&client, &mut c, "bb8").await;
            // Inside the caller's transaction, on the connection the pool handed out.
            let id = c
                .transaction(async |tx| {
                    let got = client
                        .enqueue_in(tx, vec![NewJob::new("pooled", json!("in tx"))])
                        .await?;
                    Ok::<_, Error>(got[0].id)
                })
                .await
                .unwrap();
            assert_eq!(client.get(id).await.unwrap().payload, json!("in tx"));
            #[cfg(feature = "deadpool")]
            {
                let dp = diesel_async::pooled_connection::deadpool::Pool::builder(
                    AsyncDieselConnectionManager::<$conn>::new(url.clone()),
                )
                .max_size(2)
                .build()
                .unwrap();
                let mut c = dp.get().await.unwrap();
                enqueue_through(&client, &mut c, "deadpool").await;
            }
        }};
    }
    match backend {
        Backend::Postgres => with_pools!(AsyncPgConnection),
        Backend::Mysql => with_pools!(AsyncMysqlConnection),
        Backend::Sqlite => with_pools!(SqliteConn),
    }
}

#[tokio::test]
async fn pooled_connections_enqueue_on_postgres() {
    pooled_connections_enqueue(Backend::Postgres).await;
}

#[tokio::test]
async fn pooled_connections_enqueue_on_mysql() {
    pooled_connections_enqueue(Backend::Mysql).await;
}

#[tokio::test]
async fn pooled_connections_enqueue_on_sqlite() {
    pooled_connections_enqueue(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_connection_to_another_database_is_refused_by_name() {
    let sqlite = TestDb::create(Backend::Sqlite).await;
    let pg = TestDb::create(Backend::Postgres).await;
    let pg_client = Client::new(pg.store().await);
    let sqlite_client = Client::new(sqlite.store().await);

    // An SQLite connection handed to a PostgreSQL store, and the other way round.
    let mut lite = SqliteConn::establish(&diesel_url(&sqlite)).await.unwrap();
    let mut post = AsyncPgConnection::establish(&pg.url).await.unwrap();
    for (client, err) in [
        (
            &pg_client,
            pg_client
                .enqueue_in(&mut lite, vec![NewJob::new("k", json!(1))])
                .await
                .unwrap_err(),
        ),
        (
            &sqlite_client,
            sqlite_client
                .enqueue_in(&mut post, vec![NewJob::new("k", json!(1))])
                .await
                .unwrap_err(),
        ),
    ] {
        match &err {
            Error::InvalidInput { field, reason } => {
                assert_eq!(*field, "conn");
                assert!(
                    reason.contains("expected a connection to the store's"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(client.counts().await.unwrap().is_empty(), "nothing written");
    }
    // Nothing reached the wrong databases either.
    assert!(pg_client.counts().await.unwrap().is_empty());
    assert!(sqlite_client.counts().await.unwrap().is_empty());
}
