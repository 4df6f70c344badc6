//! An operator at the dashboard: pages read at one step, buttons pressed at a later one.
//!
//! A *look* reads one plain job — most often one looked at before — and keeps its page:
//! the job's id, version and state, the last [`PAGES`] of them, as a person keeps tabs open. A *press* takes any kept page, old
//! or new, and presses the button its state offers — retry (dead, cancelled), cancel
//! (pending, retrying) or delete (finished; a fifth of the time for dead and cancelled
//! ones) — pinned at the version the page showed, as the dashboard's forms are
//! (`Simulation::retry_at`, `cancel_at`, `delete_at`: the calls its actions make). As the
//! dashboard does, a press answers with the job's page as it is now, shown in the tab that
//! pressed; the other tabs keep what they showed, so a later press from one of them often
//! meets a job that moved on: another tab's press retried or cancelled it, a node claimed it
//! or ended it. Right before pressing, the driver reads the
//! job's version itself ([`Press::now`]): what `check_operator.rs` judges the answer by.
//!
//! Only plain jobs are touched — the `work` jobs of the seed's enqueues with no unique key,
//! named as a parent by no child, and never named as one after a look — so every other
//! check reads what it read before. A job retried by hand may run again after a node
//! reported its end ([`Fleet::forget_end`]); a deleted job leaves the database, and the
//! run's checks of lost jobs skip it ([`Operator::deleted`]).
//!
//! The operator's draws come from a generator of its own (the seed and the step), so the
//! step's draws are what they were before it.

use std::collections::BTreeSet;

use jobvisor::testing::Guarded;
use jobvisor::{Error, JobId, JobState};

use crate::fleet::Fleet;
use crate::rng::{fnv, Rng, FNV_START};

/// Salt of the operator's generator.
const SALT: u64 = 0x0be7_a70e;
/// Pages kept.
const PAGES: usize = 4;
/// A look's chance per step, ‰.
const LOOK_PER_MILLE: u64 = 100;
/// A delete's chance among the buttons of a dead or cancelled job's page, ‰.
const DELETE_PER_MILLE: u64 = 200;
/// A look's chance of going back to a job looked at before, ‰.
const AGAIN_PER_MILLE: u64 = 700;
/// A press's chance per step, ‰ (drawn after the look's).
const PRESS_PER_MILLE: u64 = 200;

/// What a page showed.
#[derive(Debug, Clone)]
pub(crate) struct Page {
    pub(crate) id: i64,
    pub(crate) version: i64,
    pub(crate) state: JobState,
}

/// A dashboard button.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Button {
    Retry,
    Cancel,
    Delete,
}

/// What a press answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Written.
    Applied,
    /// Nothing written: the job moved on since the page.
    Moved,
    /// Refused with this error (a state the button does not apply to).
    Refused(String),
    /// The database failed (a store fault): not judged.
    Failed,
}

/// A button pressed.
#[derive(Debug, Clone)]
pub(crate) struct Press {
    pub(crate) step: usize,
    pub(crate) button: Button,
    pub(crate) page: Page,
    /// The job's version read right before the press (`None`: deleted).
    pub(crate) now: Option<i64>,
    pub(crate) answer: Answer,
}

/// The operator's record.
#[derive(Debug)]
pub(crate) struct Operator {
    seed: u64,
    /// Plain jobs, by id.
    plain: BTreeSet<i64>,
    /// Jobs a child named as its parent.
    parents: BTreeSet<i64>,
    /// Jobs the operator looked at.
    touched: BTreeSet<i64>,
    pages: Vec<Page>,
    /// Every press, in order.
    pub(crate) presses: Vec<Press>,
    /// Jobs a press deleted.
    pub(crate) deleted: BTreeSet<i64>,
}

impl Operator {
    pub(crate) fn new(seed: u64) -> Operator {
        Operator {
            seed,
            plain: BTreeSet::new(),
            parents: BTreeSet::new(),
            touched: BTreeSet::new(),
            pages: Vec::new(),
            presses: Vec::new(),
            deleted: BTreeSet::new(),
        }
    }

    /// Records a plain job's enqueue.
    pub(crate) fn plain(&mut self, id: i64) {
        self.plain.insert(id);
    }

    /// Whether a child may name job `id` as its parent: not once the operator looked at it.
    pub(crate) fn may_parent(&self, id: i64) -> bool {
        !self.touched.contains(&id)
    }

    /// Records the parents a child named.
    pub(crate) fn named(&mut self, ids: &[i64]) {
        self.parents.extend(ids);
    }

    /// The operator's turn at `step`: a look, a press or nothing; answers the log line.
    pub(crate) async fn step(&mut self, fleet: &mut Fleet, step: usize) -> Option<String> {
        let mut rng = Rng::new(fnv(
            &(step as u64).to_le_bytes(),
            FNV_START ^ self.seed ^ SALT,
        ));
        let roll = rng.below(1000);
        let live = fleet.drivable();
        if live.is_empty() || roll >= LOOK_PER_MILLE + PRESS_PER_MILLE {
            return None;
        }
        let at = *rng.pick(&live);
        let name = fleet.nodes[at].name.clone();
        if roll < LOOK_PER_MILLE {
            // Most looks go back to a job looked at before (a second tab, a page reloaded):
            // the operator works on a few jobs, so presses meet each other's writes.
            let again: Vec<i64> = self.touched.difference(&self.deleted).copied().collect();
            let open: Vec<i64> = self
                .plain
                .difference(&self.parents)
                .filter(|id| !self.deleted.contains(id))
                .copied()
                .collect();
            let from = if !again.is_empty() && rng.chance(AGAIN_PER_MILLE) {
                again
            } else {
                open
            };
            if from.is_empty() {
                return None;
            }
            let id = *rng.pick(&from);
            self.touched.insert(id);
            return Some(match fleet.nodes[at].sim.client.get(JobId(id)).await {
                Ok(job) => {
                    if self.pages.len() == PAGES {
                        self.pages.remove(0);
                    }
                    self.pages.push(Page {
                        id,
                        version: job.version,
                        state: job.state,
                    });
                    format!(
                        "{step}: operator on {name} looks at job {id}: {} v{}",
                        job.state, job.version
                    )
                }
                Err(_) => format!("{step}: operator on {name} looks at job {id} → error"),
            });
        }
        if self.pages.is_empty() {
            return None;
        }
        let tab = rng.below(self.pages.len() as u64) as usize;
        let page = self.pages[tab].clone();
        let button = match page.state {
            JobState::Dead | JobState::Cancelled if rng.chance(DELETE_PER_MILLE) => Button::Delete,
            JobState::Dead | JobState::Cancelled => Button::Retry,
            JobState::Succeeded => Button::Delete,
            JobState::Pending | JobState::Retrying => Button::Cancel,
            _ => return None,
        };
        let sim = &fleet.nodes[at].sim;
        let now = match sim.client.get(JobId(page.id)).await {
            Ok(job) => Some(job.version),
            Err(Error::NotFound { .. }) => None,
            Err(_) => return None,
        };
        let id = JobId(page.id);
        let answer = match button {
            Button::Retry => sim.retry_at(id, page.version).await,
            Button::Cancel => sim.cancel_at(id, page.version).await,
            Button::Delete => sim.delete_at(id, page.version).await,
        };
        let answer = match answer {
            Ok(Guarded::Applied(())) => Answer::Applied,
            Ok(_) => Answer::Moved,
            Err(Error::Database(_)) => Answer::Failed,
            Err(e) => Answer::Refused(e.to_string()),
        };
        if answer == Answer::Applied {
            match button {
                Button::Retry => fleet.forget_end(page.id),
                Button::Delete => {
                    self.deleted.insert(page.id);
                }
                Button::Cancel => {}
            }
        }
        // The dashboard answers a press with the job's page as it is now: that tab shows
        // it, the others keep what they showed.
        match fleet.nodes[at].sim.client.get(id).await {
            Ok(job) => {
                self.pages[tab] = Page {
                    id: page.id,
                    version: job.version,
                    state: job.state,
                }
            }
            Err(_) => {
                self.pages.remove(tab);
            }
        }
        if self.deleted.contains(&page.id) {
            self.pages.retain(|p| p.id != page.id);
        }
        let line = format!(
            "{step}: operator on {name} presses {button:?} on job {} at v{} (now {now:?}) → {answer:?}",
            page.id, page.version
        );
        self.presses.push(Press {
            step,
            button,
            page,
            now,
            answer,
        });
        Some(line)
    }
}
