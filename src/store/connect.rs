//! Opening a store: the URL names the backend, whose module opens its pools
//! ([`Driver::open`](super::driver::Driver::open)); then the schema is checked (or migrated).
//! The helpers every backend's connection setup shares (bounded connection attempts, the pool
//! builder) are below the backends, in `pool.rs`.
//!
//! A store keeps two pools on one database: the main one, and a small one of
//! [`RENEW_LANE_SIZE`](super::RENEW_LANE_SIZE) (2) connections for lease renewals only, so a renewal never waits behind a
//! hung claim or finalization, nor for a connection one of them holds.

use super::driver::Driver;
use super::{Backend, Inner, Store, StoreOptions};
use crate::error::{redact_url, Error, Result};

/// Splits a database URL into its backend and the URL (or, for SQLite, the file path) that
/// backend opens.
pub(crate) fn parse_url(url: &str) -> Result<(Backend, String)> {
    let bad = |reason: String| Error::InvalidInput {
        field: "url",
        reason: format!("{} in {:?}", reason, redact_url(url)),
    };
    let expected = "expected postgres://user@host/db, mysql://user@host/db or sqlite://path";
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(bad(format!("no URL scheme; {expected}")));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "postgres" | "postgresql" => Ok((Backend::Postgres, url.to_string())),
        "mysql" | "mariadb" => Ok((Backend::Mysql, format!("mysql:{rest}"))),
        "sqlite" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            let path = path.split('?').next().unwrap_or(path);
            if path.is_empty() {
                return Err(bad(format!("no file path; {expected}")));
            }
            if path == ":memory:" {
                return Err(bad(
                    "an in-memory SQLite database cannot be shared by a pool; \
                     expected a file path such as sqlite://jobs.db"
                        .to_string(),
                ));
            }
            Ok((Backend::Sqlite, path.to_string()))
        }
        other => Err(bad(format!("unknown scheme {other:?}; {expected}"))),
    }
}

impl Store {
    /// Opens a store on `url` with default options and checks its schema.
    ///
    /// `postgres://…`, `mysql://…` (MariaDB too) or `sqlite://path` (a file, created if
    /// missing, in WAL mode).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or unknown scheme, [`Error::Connect`] when
    /// the server cannot be reached or the file cannot be opened (URL redacted), and
    /// [`Error::SchemaOutOfDate`] when migrations have not been run.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo() -> jobvisor::Result<()> {
    /// use jobvisor::{Store, StoreOptions};
    /// let store = Store::connect_with("sqlite://jobs.db", StoreOptions::default().migrate(true)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Store> {
        Store::connect_with(url, StoreOptions::default()).await
    }

    /// Opens a store with explicit options; see [`Store::connect`].
    ///
    /// # Errors
    /// As [`Store::connect`], plus [`Error::Config`] for invalid options, and
    /// [`Error::InvalidInput`] for a backend this build leaves out (Cargo features
    /// `postgres`, `mysql`, `sqlite`).
    pub async fn connect_with(url: &str, opts: StoreOptions) -> Result<Store> {
        let store = Store::open(url, opts).await?;
        if store.inner.opts.migrate {
            store.migrate().await?;
        }
        store.check_schema().await?;
        Ok(store)
    }

    /// Opens a store without migrating or checking the schema (tests preparing a database
    /// as an application or an earlier build left it).
    pub(crate) async fn open(url: &str, opts: StoreOptions) -> Result<Store> {
        opts.validate()?;
        let (backend, target) = parse_url(url)?;
        let driver = Driver::open(backend, &target, url, &opts).await?;
        let store = Store {
            inner: std::sync::Arc::new(Inner {
                driver,
                url: url.to_string(),
                url_redacted: redact_url(url),
                opts,
                routes: super::claim::Routes::default(),
                #[cfg(feature = "test-util")]
                faults: super::faults::FaultSlot::default(),
            }),
        };
        Ok(store)
    }

    /// Which backend this store talks to.
    pub fn backend(&self) -> Backend {
        self.inner.driver.backend()
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }

    /// Runs a hot-path operation for at most `limit`; under a test's fault plan (feature
    /// `test-util`), as the plan decides. Not an `async fn`: it adds no layer (and no copy of
    /// `fut`) to the operation's future, whose size debug builds' deep call stacks feel.
    #[cfg(feature = "test-util")]
    pub(crate) fn bounded_for<T, F>(
        &self,
        op: super::timeout::Op,
        limit: std::time::Duration,
        fut: F,
    ) -> impl std::future::Future<Output = Result<T>>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        match self.inner.faults.get() {
            Some(plan) => futures_util::future::Either::Left(Box::pin(super::faults::run(
                plan,
                op,
                limit,
                fut,
                None::<fn() -> super::faults::Late>,
            ))),
            None => futures_util::future::Either::Right(super::timeout::bounded(op, limit, fut)),
        }
    }

    /// Runs a hot-path operation under the store's statement bound (see [`super::timeout`]);
    /// under a test's fault plan (feature `test-util`), as the plan decides. `run` makes the
    /// operation's future from a store and its parameters `p`, both owned, so that a copy
    /// can outlive the caller ([`Fault::ApplyLate`](super::faults::Fault::ApplyLate)).
    #[cfg(feature = "test-util")]
    pub(crate) fn bounded_owned<T, P, F, Fut>(
        &self,
        op: super::timeout::Op,
        p: P,
        run: F,
    ) -> impl std::future::Future<Output = Result<T>>
    where
        P: super::faults::AtNow + Clone + Send + Sync + 'static,
        F: Fn(Store, P) -> Fut + Copy + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let limit = self.inner.statement_bound();
        match self.inner.faults.get() {
            Some(plan) => {
                let (store, held) = (self.clone(), p.clone());
                let late = move || {
                    super::faults::Late::new(super::faults::StoreOp::of(op), move |now| {
                        let mut held = held;
                        held.at_now(now);
                        Box::pin(async move { run(store, held).await.map(drop) })
                    })
                };
                futures_util::future::Either::Left(Box::pin(super::faults::run(
                    plan,
                    op,
                    limit,
                    run(self.clone(), p),
                    Some(late),
                )))
            }
            None => futures_util::future::Either::Right(super::timeout::bounded(
                op,
                limit,
                run(self.clone(), p),
            )),
        }
    }

    /// Runs a hot-path operation under the store's statement bound (see [`super::timeout`]),
    /// given as `run` over an owned store and parameters `p`.
    #[cfg(not(feature = "test-util"))]
    pub(crate) fn bounded_owned<T, P, F, Fut>(
        &self,
        op: super::timeout::Op,
        p: P,
        run: F,
    ) -> impl std::future::Future<Output = Result<T>>
    where
        F: Fn(Store, P) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        super::timeout::bounded(op, self.inner.statement_bound(), run(self.clone(), p))
    }

    /// Runs an operation that has no statement bound of its own (a schedule's fire, whose
    /// jobs may be many after a long outage): under a test's fault plan (feature
    /// `test-util`), as the plan decides, within the store's statement bound, as
    /// [`bounded_owned`](Self::bounded_owned); otherwise as it is.
    #[cfg(feature = "test-util")]
    pub(crate) fn faulted_owned<T, P, F, Fut>(
        &self,
        op: super::timeout::Op,
        p: P,
        run: F,
    ) -> impl std::future::Future<Output = Result<T>>
    where
        P: super::faults::AtNow + Clone + Send + Sync + 'static,
        F: Fn(Store, P) -> Fut + Copy + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        if self.inner.faults.get().is_some() {
            futures_util::future::Either::Left(self.bounded_owned(op, p, run))
        } else {
            futures_util::future::Either::Right(run(self.clone(), p))
        }
    }

    /// Runs an operation that has no statement bound of its own, as it is.
    #[cfg(not(feature = "test-util"))]
    pub(crate) fn faulted_owned<T, P, F, Fut>(
        &self,
        _op: super::timeout::Op,
        p: P,
        run: F,
    ) -> impl std::future::Future<Output = Result<T>>
    where
        F: Fn(Store, P) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        run(self.clone(), p)
    }

    /// Runs a hot-path operation for at most `limit`.
    #[cfg(not(feature = "test-util"))]
    pub(crate) fn bounded_for<T, F>(
        &self,
        op: super::timeout::Op,
        limit: std::time::Duration,
        fut: F,
    ) -> impl std::future::Future<Output = Result<T>>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        super::timeout::bounded(op, limit, fut)
    }

    /// Runs a handler transaction's `COMMIT` (`fut`) as a test's fault plan decides
    /// ([`StoreOp::Commit`](super::faults::StoreOp::Commit), never held), within the store's
    /// statement bound; without a plan, as it is.
    #[cfg(feature = "test-util")]
    pub(crate) async fn faulted_commit(
        &self,
        fut: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        match self.inner.faults.get() {
            Some(plan) => {
                let limit = self.inner.statement_bound();
                super::faults::run(
                    plan,
                    super::timeout::Op::Commit,
                    limit,
                    fut,
                    None::<fn() -> super::faults::Late>,
                )
                .await
            }
            None => fut.await,
        }
    }

    /// Installs a fault plan: from now on every hot-path operation of this store and its
    /// clones asks it what happens (see `testing::FaultPlan`).
    #[cfg(feature = "test-util")]
    pub(crate) fn inject_faults(&self, plan: std::sync::Arc<dyn super::faults::FaultPlan>) {
        self.inner.faults.set(plan);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_or_rejected_by_name() {
        assert!(matches!(
            parse_url("postgres://u@h/db"),
            Ok((Backend::Postgres, _))
        ));
        assert!(matches!(
            parse_url("postgresql://u@h/db"),
            Ok((Backend::Postgres, _))
        ));
        assert_eq!(
            parse_url("mariadb://u@h/db").ok(),
            Some((Backend::Mysql, "mysql://u@h/db".into()))
        );
        assert_eq!(
            parse_url("sqlite://data/jobs.db").ok(),
            Some((Backend::Sqlite, "data/jobs.db".into()))
        );
        assert_eq!(
            parse_url("sqlite:///tmp/jobs.db").ok(),
            Some((Backend::Sqlite, "/tmp/jobs.db".into()))
        );
        for bad in ["redis://h", "jobs.db", "sqlite://", "sqlite://:memory:"] {
            let err = parse_url(bad).unwrap_err().to_string();
            assert!(err.contains("url"), "{bad}: {err}");
        }
        let err = parse_url("oracle://u:hunter2@h/db")
            .unwrap_err()
            .to_string();
        assert!(err.contains("oracle") && !err.contains("hunter2"), "{err}");
    }
}
