//! The run's event log: each step's action and what the fleet answered, then the final
//! state, one line each. It holds nothing a run draws at random outside the seed (no lease
//! token, no claim id, no real time), so it is a function of the seed; its hash is compared
//! between runs of one seed.

use crate::rng::{fnv, FNV_START};

/// The lines of one run and their running hash.
#[derive(Debug)]
pub(crate) struct EventLog {
    lines: Vec<String>,
    hash: u64,
}

impl EventLog {
    pub(crate) fn new() -> EventLog {
        EventLog {
            lines: Vec::new(),
            hash: FNV_START,
        }
    }

    pub(crate) fn line(&mut self, line: String) {
        self.hash = fnv(line.as_bytes(), self.hash);
        self.hash = fnv(b"\n", self.hash);
        self.lines.push(line);
    }

    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    pub(crate) fn lines(&self) -> &[String] {
        &self.lines
    }
}
