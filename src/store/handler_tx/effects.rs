//! Effect records: what a job's handlers recorded as done, one row of `jobvisor_effects` per
//! (job, effect key), written in a handler's transaction
//! ([`JobTx::record_effect`](crate::JobTx::record_effect)) so a retried attempt can tell which
//! effects already happened. This file owns the public [`Effect`] / [`Recorded`] types, the
//! key's validation and the read of a job's records; the insert is each backend's (it meets a
//! duplicate key its own way, see `handler_tx/mod.rs`), and the records are deleted with their job
//! when the archive is pruned (`maintain.rs`).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::job::JobId;
use crate::store::driver::with_conn;
use crate::store::rows::from_us;
use crate::store::schema::jobvisor_effects as effects;
use crate::store::Store;

/// The longest effect key, in bytes (255).
pub const MAX_EFFECT_KEY_LEN: usize = 255;

/// An effect a job recorded: its key, the detail recorded with it, and which claim recorded
/// it when.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Effect {
    /// The effect key, as the handler gave it.
    pub key: String,
    /// The JSON recorded with it (a provider's charge id, say); `None` if none was.
    pub detail: Option<Value>,
    /// The claim id of the attempt that recorded it ([`ClaimId`](crate::ClaimId), as text).
    pub claim: String,
    /// When it was recorded (the database's clock).
    pub recorded_at: DateTime<Utc>,
}

impl Effect {
    pub(crate) fn from_row(
        (key, detail, claim, recorded_at): (String, Option<Value>, String, i64),
    ) -> Self {
        Effect {
            key,
            detail,
            claim,
            recorded_at: from_us(recorded_at),
        }
    }
}

/// What [`JobTx::record_effect`](crate::JobTx::record_effect) found.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Recorded now: it commits with the transaction (and vanishes if that rolls back).
    New,
    /// Already recorded (by an earlier attempt, or an earlier statement of this one): the
    /// record as it stands; nothing was written.
    Already(Effect),
}

impl Recorded {
    /// True if this call recorded the effect ([`Recorded::New`]).
    pub fn is_new(&self) -> bool {
        matches!(self, Recorded::New)
    }
}

/// Checks an effect key: 1 to [`MAX_EFFECT_KEY_LEN`] bytes, no NUL.
///
/// # Errors
/// [`Error::InvalidInput`] (`effect key`) saying what was wrong and what is expected.
pub(crate) fn validate_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "is empty".to_string()
    } else if key.len() > MAX_EFFECT_KEY_LEN {
        format!("is {} bytes long", key.len())
    } else if key.contains('\0') {
        "contains a NUL character".to_string()
    } else {
        return Ok(());
    };
    Err(Error::invalid(
        "effect key",
        format!(
            "{:?} {reason}; expected 1 to {MAX_EFFECT_KEY_LEN} bytes without NUL (name the \
             effect, e.g. \"charge\" or \"email:welcome\")",
            key.chars().take(40).collect::<String>()
        ),
    ))
}

impl Store {
    /// Every effect recorded for job `id`, by key (live or archived jobs; none once the
    /// archive is pruned).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_effects(&self, id: JobId) -> Result<Vec<Effect>> {
        let rows: Vec<(String, Option<Value>, String, i64)> = with_conn!(self, |conn| {
            effects::table
                .select((
                    effects::effect_key,
                    effects::detail,
                    effects::claim,
                    effects::recorded_at,
                ))
                .filter(effects::job_id.eq(id.0))
                .order(effects::effect_key.asc())
                .load(conn)
                .await?
        });
        Ok(rows.into_iter().map(Effect::from_row).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_naming_what_was_wrong() {
        assert!(validate_key("charge").is_ok());
        assert!(validate_key(&"k".repeat(MAX_EFFECT_KEY_LEN)).is_ok());
        for (key, says) in [
            (String::new(), "is empty"),
            ("k".repeat(MAX_EFFECT_KEY_LEN + 1), "is 256 bytes long"),
            ("a\0b".to_string(), "NUL"),
        ] {
            let e = validate_key(&key).unwrap_err().to_string();
            assert!(e.contains("effect key") && e.contains(says), "{e}");
            assert!(e.contains("expected 1 to 255 bytes"), "{e}");
        }
    }
}
