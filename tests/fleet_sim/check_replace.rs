//! The invariants of replacing enqueues (`replace.rs`), checked after every run on the
//! driver's record of the enqueues answered `replaced`, the final rows and the journal's
//! executions in the run's order:
//!
//! 1. **A replaced payload is never run again.** Once an enqueue answered that it replaced
//!    job J's payload with the one numbered n, no execution of J that starts later runs an
//!    older payload: its `n` is n or a later replacement's (payload numbers only grow). The
//!    replace applies only to a holder that is pending and never started, guarded by its
//!    version; a claim taken before it ran the old payload and is fenced before the job is
//!    pending again.
//! 2. **A cancelled holder never starts again.** Once an enqueue answered that it cancelled
//!    the holder of key k and inserted job N in its place, no execution of an older job of
//!    key k starts later: the holder was cancelled, and every older job had released the key
//!    (it is held while its job is live), so had ended.

use jobvisor::OnDuplicate;

use crate::check_controls::Facts;

/// Every rule broken, one line each.
pub(crate) fn check(f: &Facts<'_>) -> Vec<String> {
    let mut bad = Vec::new();
    for act in &f.controls.replaces {
        match act.how {
            OnDuplicate::Replace => {
                for (i, (x, o)) in f.execs.iter().zip(f.orders).enumerate() {
                    if x.job_id == act.id
                        && o.start > act.mark
                        && !f.started_blind(i)
                        && o.payload_n < Some(act.n)
                    {
                        bad.push(format!(
                            "replace: job {} ran payload n={:?} after its replacement by \
                             n={} was answered: {x:?}",
                            act.id, o.payload_n, act.n
                        ));
                    }
                }
            }
            OnDuplicate::CancelAndInsert => {
                for j in f.jobs.iter().filter(|j| {
                    j.id.0 < act.id && j.unique_key.as_deref() == Some(act.key.as_str())
                }) {
                    for (i, (x, o)) in f.execs.iter().zip(f.orders).enumerate() {
                        if x.job_id == j.id.0 && o.start > act.mark && !f.started_blind(i) {
                            bad.push(format!(
                                "replace: job {} of key {} ({}) started after job {} was \
                                 answered inserted in its place: {x:?}",
                                j.id.0, act.key, j.state, act.id
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    bad
}
