//! The jobs table's bloat figures the `steady` modes print every interval, per backend, read on
//! a connection of their own:
//! * PostgreSQL: `jobvisor_jobs`' heap (`pg_table_size`: heap, free-space map, visibility map,
//!   TOAST) and its indexes (`pg_indexes_size`), and from `pg_stat_user_tables` its live and
//!   dead tuples, updates and HOT updates (the HOT ratio is of the interval's updates), and its
//!   autovacuum and manual vacuum runs (the archiver's vacuums are manual ones).
//! * MariaDB: `jobvisor_jobs`' data, indexes and free space from `information_schema.TABLES`
//!   after an `ANALYZE TABLE` (InnoDB's persistent statistics lag the table otherwise), and the
//!   server-wide InnoDB history list length (`Innodb_history_list_length`: undo records purge
//!   has not yet removed — its lag).
//! * SQLite: the database file's size, its write-ahead log's and the pages on its freelist
//!   (a file holds every table; there is no per-table size without the `dbstat` extension).

use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use jobvisor::Backend;

use crate::scale::{sqlite_conn, SqliteAsync};

/// MariaDB's InnoDB history list length, server-wide.
const HISTORY_LIST: &str = "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS a, 0 AS b, 0 AS c \
     FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_HISTORY_LIST_LENGTH'";

/// One reading of the figures; the fields a backend has no equivalent of are `None`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Bloat {
    /// The table's own bytes (PostgreSQL, MariaDB) or the database file's (SQLite).
    pub(crate) table_bytes: i64,
    /// Its indexes' bytes (PostgreSQL, MariaDB); the write-ahead log's (SQLite).
    pub(crate) index_bytes: i64,
    live: Option<i64>,
    dead: Option<i64>,
    updates: Option<i64>,
    hot_updates: Option<i64>,
    autovacuums: Option<i64>,
    vacuums: Option<i64>,
    /// MariaDB: free bytes inside the tablespace.
    data_free: Option<i64>,
    /// MariaDB: the InnoDB history list length.
    history: Option<i64>,
    /// SQLite: pages on the freelist.
    freelist: Option<i64>,
}

impl Bloat {
    /// The backend's columns of one interval's row, `prev` being the reading at its start:
    /// (header, value) pairs.
    pub(crate) fn columns(&self, backend: Backend, prev: &Bloat) -> Vec<(&'static str, String)> {
        let mb = |b: i64| format!("{:.1}", b as f64 / 1_048_576.0);
        let num = |x: Option<i64>| x.map_or("-".to_string(), |v| v.to_string());
        let delta = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        };
        match backend {
            Backend::Postgres => {
                let upd = delta(self.updates, prev.updates).unwrap_or(0);
                let hot = delta(self.hot_updates, prev.hot_updates).unwrap_or(0);
                let ratio = if upd > 0 {
                    format!("{:.0} %", hot as f64 / upd as f64 * 100.0)
                } else {
                    "-".to_string()
                };
                vec![
                    ("table MB", mb(self.table_bytes)),
                    ("indexes MB", mb(self.index_bytes)),
                    ("live tuples", num(self.live)),
                    ("dead tuples", num(self.dead)),
                    ("HOT updates", ratio),
                    (
                        "autovacuums",
                        num(delta(self.autovacuums, prev.autovacuums)),
                    ),
                    ("vacuums", num(delta(self.vacuums, prev.vacuums))),
                ]
            }
            Backend::Mysql => vec![
                ("table MB", mb(self.table_bytes)),
                ("indexes MB", mb(self.index_bytes)),
                ("free MB", self.data_free.map_or("-".to_string(), mb)),
                ("history list", num(self.history)),
            ],
            Backend::Sqlite => vec![
                ("file MB", mb(self.table_bytes)),
                ("WAL MB", mb(self.index_bytes)),
                ("freelist pages", num(self.freelist)),
            ],
        }
    }
}

/// The figure that rises and falls within an interval, read every second: PostgreSQL's dead
/// tuples (autovacuum takes them once a round, `autovacuum_naptime`, so one reading per
/// interval shows whichever phase of that cycle it lands on) and MariaDB's history list.
/// Its mean and peak over the interval.
#[derive(Default)]
pub(crate) struct Swing {
    max: i64,
    sum: i64,
    n: i64,
}

impl Swing {
    pub(crate) fn add(&mut self, v: i64) {
        self.max = self.max.max(v);
        self.sum += v;
        self.n += 1;
    }

    /// The backend's columns: (header, value) pairs.
    pub(crate) fn columns(&self, backend: Backend) -> Vec<(&'static str, String)> {
        let mean = if self.n > 0 {
            (self.sum / self.n).to_string()
        } else {
            "-".to_string()
        };
        let max = if self.n > 0 {
            self.max.to_string()
        } else {
            "-".to_string()
        };
        match backend {
            Backend::Postgres => vec![("dead mean", mean), ("dead max", max)],
            Backend::Mysql => vec![("history mean", mean), ("history max", max)],
            Backend::Sqlite => Vec::new(),
        }
    }
}

/// A connection that reads [`Bloat`].
pub(crate) enum BloatProbe {
    Pg(tokio_postgres::Client),
    Mysql(AsyncMysqlConnection),
    /// The connection and the database file's path.
    Sqlite(SqliteAsync, String),
}

#[derive(diesel::QueryableByName)]
struct Three {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    a: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    b: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    c: i64,
}

impl BloatProbe {
    pub(crate) async fn open(backend: Backend, url: &str) -> Self {
        match backend {
            Backend::Postgres => {
                let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(conn);
                BloatProbe::Pg(client)
            }
            Backend::Mysql => {
                BloatProbe::Mysql(AsyncMysqlConnection::establish(url).await.expect("connect"))
            }
            Backend::Sqlite => BloatProbe::Sqlite(
                sqlite_conn(url).await,
                url.trim_start_matches("sqlite://").to_string(),
            ),
        }
    }

    /// The [`Swing`] figure now (SQLite: none).
    pub(crate) async fn swing(&mut self) -> Option<i64> {
        match self {
            BloatProbe::Pg(client) => Some(
                client
                    .query_one(
                        "SELECT n_dead_tup FROM pg_stat_user_tables \
                         WHERE relid = 'jobvisor_jobs'::regclass",
                        &[],
                    )
                    .await
                    .expect("pg_stat_user_tables")
                    .get(0),
            ),
            BloatProbe::Mysql(conn) => {
                let h: Three = diesel::sql_query(HISTORY_LIST)
                    .get_result(conn)
                    .await
                    .expect("Innodb_history_list_length");
                Some(h.a)
            }
            BloatProbe::Sqlite(..) => None,
        }
    }

    pub(crate) async fn read(&mut self) -> Bloat {
        match self {
            BloatProbe::Pg(client) => {
                // Each statement its own transaction: the statistics are read afresh.
                let r = client
                    .query_one(
                        "SELECT pg_table_size(relid), pg_indexes_size(relid), n_live_tup, \
                         n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, vacuum_count \
                         FROM pg_stat_user_tables WHERE relid = 'jobvisor_jobs'::regclass",
                        &[],
                    )
                    .await
                    .expect("pg_stat_user_tables");
                Bloat {
                    table_bytes: r.get(0),
                    index_bytes: r.get(1),
                    live: Some(r.get(2)),
                    dead: Some(r.get(3)),
                    updates: Some(r.get(4)),
                    hot_updates: Some(r.get(5)),
                    autovacuums: Some(r.get(6)),
                    vacuums: Some(r.get(7)),
                    ..Bloat::default()
                }
            }
            BloatProbe::Mysql(conn) => {
                conn.batch_execute("ANALYZE TABLE jobvisor_jobs")
                    .await
                    .expect("analyze");
                let t: Three = diesel::sql_query(
                    "SELECT CAST(data_length AS SIGNED) AS a, CAST(index_length AS SIGNED) AS b, \
                     CAST(data_free AS SIGNED) AS c FROM information_schema.TABLES \
                     WHERE table_schema = DATABASE() AND table_name = 'jobvisor_jobs'",
                )
                .get_result(conn)
                .await
                .expect("information_schema.TABLES");
                let h: Three = diesel::sql_query(HISTORY_LIST)
                    .get_result(conn)
                    .await
                    .expect("Innodb_history_list_length");
                Bloat {
                    table_bytes: t.a,
                    index_bytes: t.b,
                    data_free: Some(t.c),
                    history: Some(h.a),
                    ..Bloat::default()
                }
            }
            BloatProbe::Sqlite(conn, path) => {
                let r: Three = diesel::sql_query(
                    "SELECT p.page_count * s.page_size AS a, f.freelist_count AS b, 0 AS c \
                     FROM pragma_page_count() AS p, pragma_freelist_count() AS f, \
                     pragma_page_size() AS s",
                )
                .get_result(conn)
                .await
                .expect("pragmas");
                let wal = std::fs::metadata(format!("{path}-wal")).map_or(0, |m| m.len());
                Bloat {
                    table_bytes: r.a,
                    index_bytes: i64::try_from(wal).unwrap_or(i64::MAX),
                    freelist: Some(r.b),
                    ..Bloat::default()
                }
            }
        }
    }
}
