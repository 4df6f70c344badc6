//! The rule of an operator's pinned presses (`operator.rs`; §6 invariant 1 for writers
//! that hold no lease): a button pressed on a page showing version v writes only while the
//! job is still at v — a job that moved on since (retried by another press, claimed,
//! ended) is left as it is — and a job still at v is written (the button its state offers
//! is never refused). The version the driver read right before the press is the judge.

use crate::operator::{Answer, Press};

/// Every rule broken, one line each.
pub(crate) fn check(presses: &[Press]) -> Vec<String> {
    let mut bad = Vec::new();
    for p in presses {
        let moved = p.now != Some(p.page.version);
        let what = format!(
            "step {}: {:?} on job {} pinned at version {}",
            p.step, p.button, p.page.id, p.page.version
        );
        match &p.answer {
            Answer::Applied if moved => bad.push(format!(
                "pinned press: {what} was applied, though the job had moved on to {:?}",
                p.now
            )),
            Answer::Moved if !moved => bad.push(format!(
                "pinned press: {what} answered that the job moved on, though it had not"
            )),
            Answer::Refused(e) if !moved => bad.push(format!(
                "pinned press: {what} was refused ({e}), though the job had not changed"
            )),
            _ => {}
        }
    }
    bad
}
