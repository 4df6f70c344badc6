//! Periodic schedules (`jobvisor_schedules`): synced from the nodes' code at start, or added,
//! changed and removed at run time; fired by the leader, paused, resumed and triggered by
//! operators.
//!
//! * **Fire**: one transaction moves `next_fire_at` on — guarded by the value the firer read,
//!   by the schedule being live (not paused, not retired) and, for a leader, by its term — and
//!   inserts the fire's jobs, each keyed by the schedule and the fire's instant. Of firers
//!   that read the same row, one moves it and the others change nothing (the row lock, then
//!   the guard re-evaluated on the committed row); and were a fire ever inserted twice, its
//!   unique key would make the second a duplicate. So each fire enqueues exactly one job.
//! * **Sync**: a node that declares schedules upserts them at start — a new one gets its first
//!   fire after now; a changed expression or zone starts afresh from now; an unchanged one
//!   keeps its next fire, so fires missed while no node ran are handled by its missed-fire
//!   policy — and stamps them `declared_at`. While it runs it declares them again now and
//!   then (a **refresh**: the stamp only, whatever another release stored). A retired
//!   schedule declared again starts afresh from now: the time it was retired is not missed.
//! * **Retire**: a syncing node retires the live rows nobody has declared for `retire_after`,
//!   so during a rolling deploy a node of the older release that restarts cannot retire a
//!   schedule the newer nodes still declare. A node that declares none changes nothing.
//! * **Origin**: a row is `code` (the above) or `runtime` (added through the client: `Put`,
//!   `schedule_remove`). Syncs and retirement touch code rows only, so a deploy never
//!   overwrites or retires a run-time schedule; a run-time write of a live code name is
//!   refused, and a name declared in code that a run-time row holds is not stored (logged,
//!   and stamped on that row as `shadowed_at`, so the reads show it).
//!   Both are fired alike, by the guarded fire above.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::dsl::exists;
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::columns::bound;
use super::driver::{with_conn, with_tx, with_write};
use super::expr::DbNow;
use super::leader_fence;
use super::mutation::{on, Mutation};
use super::outbox::OutboxConnection;
use super::params::{Enqueued, FireParams};
use super::rows::{dur_us, from_us};
use super::schema::jobvisor_schedules as s;
use super::timeout::Op;
use super::Store;
use crate::error::{Error, Result, StoreError};
use crate::job::NewJob;
use crate::schedule::{Compiled, MissedFires, Plan, ScheduleInfo, ScheduleOrigin, Template};

/// A schedule due to fire, as read by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub(crate) struct DueSchedule {
    pub(crate) name: String,
    pub(crate) spec: String,
    pub(crate) time_zone: String,
    pub(crate) template: String,
    pub(crate) missed: String,
    pub(crate) next_fire_at: i64,
    pub(crate) last_fire_at: Option<i64>,
}

/// A fire to write: the row as read, where it moves to, and the jobs it enqueues.
#[derive(Debug)]
pub(crate) struct Fire<'a> {
    pub(crate) name: &'a str,
    /// `next_fire_at` as read (the guard).
    pub(crate) expected_next: i64,
    /// Its new value; `None` when the expression never matches again (the row retires).
    pub(crate) next: Option<i64>,
    /// The schedule's last fire afterwards: the latest fire enqueued, or the one before.
    pub(crate) last_fire: Option<i64>,
    pub(crate) jobs: Vec<NewJob>,
    /// `(node, term)`: only while this leadership holds.
    pub(crate) leader: Option<(&'a str, i64)>,
}

type Row = (
    String,
    String,
    String,
    String,
    String,
    i64,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    i64,
    String,
    Option<i64>,
);

/// `origin` of a schedule declared in code.
const CODE: &str = ScheduleOrigin::Code.as_str();
/// `origin` of a schedule added at run time.
const RUNTIME: &str = ScheduleOrigin::Runtime.as_str();

/// What a run-time write of a schedule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// Stores a new one (refused if one of that name is stored and live).
    Add,
    /// Changes a stored run-time one.
    Change,
}

/// What a sync does with the rows this node declares that are stored and live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncMode {
    /// At start: this node's code wins (template and policy; a changed expression or zone
    /// starts afresh).
    Start,
    /// While running: the `declared_at` stamp only.
    Refresh,
}

impl Store {
    /// Upserts `schedules` (see [`SyncMode`]) and retires the live rows not among them that
    /// nobody has declared for `retire_after` (nothing at all if `schedules` is empty). `now`:
    /// a test clock, or `None` for the database's.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn schedules_sync(
        &self,
        schedules: &[Compiled],
        mode: SyncMode,
        retire_after: Duration,
        now: Option<DateTime<Utc>>,
    ) -> Result<()> {
        if schedules.is_empty() {
            return Ok(());
        }
        let mut tries = 0;
        loop {
            tries += 1;
            match self
                .schedules_sync_once(schedules, mode, retire_after, now)
                .await
            {
                // Two nodes inserting one new schedule at once (the loser sees the row now),
                // or a deadlock between two syncs: worth another go; anything else is not.
                Err(e) if tries < 3 && (e.is_transient() || is_constraint(&e)) => {
                    tracing::debug!(error = %e, "schedule sync retried");
                }
                res => return res,
            }
        }
    }

    async fn schedules_sync_once(
        &self,
        schedules: &[Compiled],
        mode: SyncMode,
        retire_after: Duration,
        now: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let now = DbNow::new(bound(now));
        let names: Vec<&str> = schedules.iter().map(|c| c.name.as_str()).collect();
        let retire_after = dur_us(retire_after);
        with_tx!(self, |conn| {
            let at: i64 = diesel::select(now).get_result(conn).await?;
            for c in schedules {
                let first = Plan::parse(&c.spec, &c.time_zone)
                    .map_err(|reason| Error::invalid("schedule", reason))?
                    .next_after(at);
                let origin: Option<String> = s::table
                    .filter(s::name.eq(&c.name))
                    .select(s::origin)
                    .first(conn)
                    .await
                    .optional()?;
                if origin.as_deref() == Some(RUNTIME) {
                    // Added at run time: a deploy never overwrites it (ARCHITECTURE.md §7.10).
                    // The row says so, for the schedules page and `jobvisor schedules`.
                    diesel::update(
                        s::table
                            .filter(s::name.eq(&c.name))
                            .filter(s::origin.eq(RUNTIME)),
                    )
                    .set(s::shadowed_at.eq(Some(at)))
                    .execute(conn)
                    .await?;
                    tracing::warn!(
                        schedule = %c.name,
                        "schedule declared in code not stored: a schedule of that name was \
                         added at run time (remove it with `jobvisor schedule remove`, or \
                         rename the one in code)"
                    );
                    continue;
                }
                let exists = origin.is_some();
                // Code rows only: a retired row taken over at run time meanwhile is left.
                let row = s::table
                    .filter(s::name.eq(&c.name))
                    .filter(s::origin.eq(CODE));
                let common = (
                    s::template.eq(&c.template),
                    s::missed.eq(&c.missed),
                    s::retired_at.eq(None::<i64>),
                    s::updated_at.eq(at),
                    s::declared_at.eq(at),
                );
                let afresh = (
                    s::spec.eq(&c.spec),
                    s::time_zone.eq(&c.time_zone),
                    // Never again: never due (listed with no next fire).
                    s::next_fire_at.eq(first.unwrap_or(i64::MAX)),
                );
                if !exists {
                    if first.is_some() {
                        diesel::insert_into(s::table)
                            .values((s::name.eq(&c.name), afresh, common))
                            .execute(conn)
                            .await?;
                    }
                    continue;
                }
                // A live row is kept (its next fire with it) by an update guarded on its being
                // live, so a retirement committed by another node meanwhile is never
                // overwritten with a stale next fire; otherwise — retired, or changed at
                // start — it starts afresh from now, as if new.
                let live = row.filter(s::retired_at.is_null());
                let kept = match mode {
                    SyncMode::Refresh => {
                        diesel::update(live)
                            .set(s::declared_at.eq(at))
                            .execute(conn)
                            .await?
                    }
                    SyncMode::Start => {
                        diesel::update(
                            live.filter(s::spec.eq(&c.spec))
                                .filter(s::time_zone.eq(&c.time_zone)),
                        )
                        .set(common)
                        .execute(conn)
                        .await?
                    }
                };
                if kept == 0 {
                    diesel::update(row)
                        .set((afresh, common))
                        .execute(conn)
                        .await?;
                }
            }
            diesel::update(
                s::table
                    .filter(s::retired_at.is_null())
                    .filter(s::origin.eq(CODE))
                    .filter(s::name.ne_all(&names))
                    .filter(s::declared_at.lt(at.saturating_sub(retire_after))),
            )
            .set((s::retired_at.eq(at), s::updated_at.eq(at)))
            .execute(conn)
            .await?;
            Result::Ok(())
        })
    }

    /// The database's "now" and the live schedules whose next fire has come (with none due,
    /// "now" is not read and is 0).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn schedules_due(
        &self,
        now: Option<DateTime<Utc>>,
    ) -> Result<(i64, Vec<DueSchedule>)> {
        let now = DbNow::new(bound(now));
        Ok(with_conn!(self, |conn| {
            // The clock is read after the due rows, and only if there are any: an idle
            // leader's tick is one statement. Read later, `at` is no earlier than the time
            // the rows were found due at.
            let due = s::table
                .filter(s::next_fire_at.le(now))
                .filter(s::paused_at.is_null())
                .filter(s::retired_at.is_null())
                .select((
                    s::name,
                    s::spec,
                    s::time_zone,
                    s::template,
                    s::missed,
                    s::next_fire_at,
                    s::last_fire_at,
                ))
                .order(s::next_fire_at.asc())
                .load::<DueSchedule>(conn)
                .await?;
            let at: i64 = if due.is_empty() {
                0
            } else {
                diesel::select(now).get_result(conn).await?
            };
            (at, due)
        }))
    }

    /// Writes one fire (see the module docs). `Some`: this call fired, with what its jobs
    /// became; `None`: another firer did, or the schedule was paused, retired or the
    /// leadership ended.
    ///
    /// # Errors
    /// [`Error::Database`]; [`Error::InvalidInput`] for a job the template cannot make.
    pub(crate) async fn schedule_fire(
        &self,
        f: Fire<'_>,
        now: Option<DateTime<Utc>>,
    ) -> Result<Option<Vec<Enqueued>>> {
        self.validate_jobs(&f.jobs)?;
        let p = FireParams {
            name: f.name.to_owned(),
            expected_next: f.expected_next,
            next: f.next,
            last_fire: f.last_fire,
            jobs: f.jobs,
            leader: f.leader.map(|(node, term)| (node.to_owned(), term)),
            now,
        };
        self.faulted_owned(Op::Fire, p, |s, p| async move { s.fire_unbounded(p).await })
            .await
    }

    /// [`schedule_fire`](Self::schedule_fire)'s transaction.
    async fn fire_unbounded(&self, p: FireParams) -> Result<Option<Vec<Enqueued>>> {
        let bound_now = bound(p.now);
        let now = DbNow::new(bound_now);
        let insert_returning = self.insert_returning();
        let live = s::table
            .filter(s::name.eq(p.name.as_str()))
            .filter(s::next_fire_at.eq(p.expected_next))
            .filter(s::paused_at.is_null())
            .filter(s::retired_at.is_null());
        let set = (
            // Never again: never due (listed with no next fire).
            s::next_fire_at.eq(p.next.unwrap_or(i64::MAX)),
            s::last_fire_at.eq(p.last_fire),
            s::updated_at.eq(now),
        );
        let leader = p.leader.as_ref().map(|(node, term)| (node.as_str(), *term));
        let jobs = p.jobs;
        with_tx!(self, |conn| {
            let n = match leader.filter(|_| !on(Mutation::FireTerm)) {
                Some((node, term)) => {
                    diesel::update(live.filter(exists(leader_fence!(node, term, now))))
                        .set(set)
                        .execute(conn)
                        .await?
                }
                None => diesel::update(live).set(set).execute(conn).await?,
            };
            if n == 0 {
                return Result::Ok(None);
            }
            if jobs.is_empty() {
                return Ok(Some(Vec::new()));
            }
            let got = conn.enqueue_on(&jobs, bound_now, insert_returning).await?;
            Ok(Some(got.into_iter().flatten().collect()))
        })
    }

    /// Every schedule this release can read, by name (an unreadable row is logged and left
    /// out).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn schedules_list(&self) -> Result<Vec<ScheduleInfo>> {
        let rows: Vec<Row> = with_conn!(self, |conn| {
            s::table
                .select((
                    s::name,
                    s::spec,
                    s::time_zone,
                    s::template,
                    s::missed,
                    s::next_fire_at,
                    s::last_fire_at,
                    s::paused_at,
                    s::retired_at,
                    s::declared_at,
                    s::origin,
                    s::shadowed_at,
                ))
                .order(s::name.asc())
                .load(conn)
                .await?
        });
        // A row this release cannot read (stored by a newer one) is left out, not fatal:
        // the others are still listed and managed.
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                info(r)
                    .map_err(|e| tracing::warn!(error = %e, "schedule not listed: unreadable"))
                    .ok()
            })
            .collect())
    }

    /// Pauses (`true`) or resumes a schedule; answers it as stored afterwards.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming an unknown schedule; [`Error::Database`].
    pub(crate) async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<DateTime<Utc>>,
    ) -> Result<ScheduleInfo> {
        let now = DbNow::new(bound(now));
        let n: i64 = with_write!(self, |conn| {
            let row = s::table.filter(s::name.eq(name));
            if paused {
                diesel::update(row.filter(s::paused_at.is_null()))
                    .set((s::paused_at.eq(now.nullable()), s::updated_at.eq(now)))
                    .execute(conn)
                    .await?;
            } else {
                diesel::update(row)
                    .set((s::paused_at.eq(None::<i64>), s::updated_at.eq(now)))
                    .execute(conn)
                    .await?;
            }
            s::table
                .filter(s::name.eq(name))
                .count()
                .get_result::<i64>(conn)
                .await?
        });
        if n == 0 {
            return Err(unknown(name));
        }
        self.schedule_get(name).await?.ok_or_else(|| unknown(name))
    }

    /// Adds a schedule at run time, or changes one added so (see [`Put`]): a new one, or a
    /// changed expression or zone, starts afresh from now (its first fire after now); an
    /// unchanged expression keeps its next fire. A live schedule declared in code is refused;
    /// a retired one is taken over. Answers it as stored.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming a schedule declared in code, one already stored (add),
    /// or no run-time schedule of that name (change); [`Error::Database`].
    pub(crate) async fn schedule_put(
        &self,
        c: &Compiled,
        put: Put,
        now: Option<DateTime<Utc>>,
    ) -> Result<ScheduleInfo> {
        let now = DbNow::new(bound(now));
        let plan = Plan::parse(&c.spec, &c.time_zone)
            .map_err(|reason| Error::invalid("schedule", reason))?;
        let res = with_tx!(self, |conn| {
            let at: i64 = diesel::select(now).get_result(conn).await?;
            // Never again: never due (listed with no next fire).
            let first = plan.next_after(at).unwrap_or(i64::MAX);
            let stored: Option<(String, Option<i64>, String, String)> = s::table
                .filter(s::name.eq(&c.name))
                .select((s::origin, s::retired_at, s::spec, s::time_zone))
                .first(conn)
                .await
                .optional()?;
            let row = s::table.filter(s::name.eq(&c.name));
            let common = (
                s::template.eq(&c.template),
                s::missed.eq(&c.missed),
                s::updated_at.eq(at),
                s::declared_at.eq(at),
            );
            let afresh = (
                s::spec.eq(&c.spec),
                s::time_zone.eq(&c.time_zone),
                s::next_fire_at.eq(first),
            );
            match (put, stored) {
                (_, Some((origin, None, ..))) if origin != RUNTIME => {
                    return Err(declared_in_code(&c.name));
                }
                (Put::Add, Some((origin, ..))) if origin == RUNTIME => {
                    return Err(Error::invalid(
                        "schedule",
                        format!(
                            "a schedule {:?} was already added at run time; expected a new \
                             name (change_schedule changes it)",
                            c.name
                        ),
                    ));
                }
                // A retired schedule of code: taken over, from now on.
                (Put::Add, Some(_)) => {
                    diesel::update(row.filter(s::retired_at.is_not_null()))
                        .set((
                            afresh,
                            common,
                            s::origin.eq(RUNTIME),
                            s::retired_at.eq(None::<i64>),
                            s::paused_at.eq(None::<i64>),
                        ))
                        .execute(conn)
                        .await?;
                }
                (Put::Add, None) => {
                    diesel::insert_into(s::table)
                        .values((s::name.eq(&c.name), afresh, common, s::origin.eq(RUNTIME)))
                        .execute(conn)
                        .await?;
                }
                (Put::Change, Some((origin, _, spec, zone))) if origin == RUNTIME => {
                    let row = row.filter(s::origin.eq(RUNTIME));
                    if spec == c.spec && zone == c.time_zone {
                        diesel::update(row).set(common).execute(conn).await?;
                    } else {
                        diesel::update(row)
                            .set((afresh, common))
                            .execute(conn)
                            .await?;
                    }
                }
                (Put::Change, _) => return Err(not_runtime(&c.name)),
            }
            Result::Ok(())
        });
        match res {
            // Two adds of one new name at once: the loser is told it exists.
            Err(e) if put == Put::Add && is_constraint(&e) => Err(Error::invalid(
                "schedule",
                format!(
                    "a schedule {:?} was added meanwhile; expected a new name",
                    c.name
                ),
            )),
            res => res,
        }?;
        self.schedule_get(&c.name)
            .await?
            .ok_or_else(|| unknown(&c.name))
    }

    /// Removes a schedule added at run time: it fires no more (a fire racing the removal
    /// finds no row to move on, so enqueues nothing). Its fires' jobs stay.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming a schedule declared in code or an unknown one;
    /// [`Error::Database`].
    pub(crate) async fn schedule_remove(&self, name: &str) -> Result<()> {
        with_tx!(self, |conn| {
            let origin: Option<String> = s::table
                .filter(s::name.eq(name))
                .select(s::origin)
                .first(conn)
                .await
                .optional()?;
            match origin.as_deref() {
                None => Err(not_runtime(name)),
                Some(RUNTIME) => {
                    diesel::delete(
                        s::table
                            .filter(s::name.eq(name))
                            .filter(s::origin.eq(RUNTIME)),
                    )
                    .execute(conn)
                    .await?;
                    Ok(())
                }
                Some(_) => Err(declared_in_code(name)),
            }
        })
    }

    /// One schedule (`None` also for a row this release cannot read).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn schedule_get(&self, name: &str) -> Result<Option<ScheduleInfo>> {
        Ok(self
            .schedules_list()
            .await?
            .into_iter()
            .find(|i| i.name == name))
    }

    /// The job template of a schedule, to trigger it now.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming an unknown schedule; [`Error::Database`];
    /// [`Error::Database`] for an unreadable template.
    pub(crate) async fn schedule_template(&self, name: &str) -> Result<Template> {
        let t: Option<String> = with_conn!(self, |conn| {
            s::table
                .filter(s::name.eq(name))
                .select(s::template)
                .first(conn)
                .await
                .optional()?
        });
        let t = t.ok_or_else(|| unknown(name))?;
        Template::from_text(&t).map_err(|reason| corrupt(name, reason))
    }
}

fn unknown(name: &str) -> Error {
    Error::invalid(
        "schedule",
        format!("no schedule {name:?}; expected the name of a stored schedule (jobvisor schedules lists them)"),
    )
}

fn declared_in_code(name: &str) -> Error {
    Error::invalid(
        "schedule",
        format!(
            "{name:?} is declared in code (SchedulerBuilder::periodic); expected a schedule \
             added at run time — change or remove this one in code, or use another name"
        ),
    )
}

fn not_runtime(name: &str) -> Error {
    Error::invalid(
        "schedule",
        format!(
            "no schedule {name:?} added at run time; expected the name of one \
             (jobvisor schedules lists them)"
        ),
    )
}

/// A stored schedule that cannot be read back.
fn corrupt(name: &str, reason: String) -> Error {
    Error::Database(StoreError::Other(format!(
        "schedule {name:?} is unreadable: {reason}"
    )))
}

fn info(r: Row) -> Result<ScheduleInfo> {
    let (
        name,
        spec,
        time_zone,
        template,
        missed,
        next,
        last,
        paused,
        retired,
        declared,
        origin,
        shadowed,
    ) = r;
    let origin = ScheduleOrigin::from_text(&origin)
        .ok_or_else(|| corrupt(&name, format!("unknown origin {origin:?}")))?;
    let t = Template::from_text(&template).map_err(|r| corrupt(&name, r))?;
    let missed = MissedFires::from_text(&missed)
        .ok_or_else(|| corrupt(&name, format!("unknown missed-fire policy {missed:?}")))?;
    Ok(ScheduleInfo {
        kind: t.kind().to_string(),
        queue: t.queue().to_string(),
        name,
        spec,
        time_zone,
        missed,
        next_fire_at: (next != i64::MAX).then(|| from_us(next)),
        last_fire_at: last.map(from_us),
        paused_at: paused.map(from_us),
        retired_at: retired.map(from_us),
        declared_at: from_us(declared),
        origin,
        shadowed_at: shadowed.map(from_us),
    })
}

fn is_constraint(e: &Error) -> bool {
    matches!(e, Error::Database(StoreError::Constraint { .. }))
}
