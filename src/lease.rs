//! Lease identities: the node that holds a lease and the random token every write by the
//! holder must present (ARCHITECTURE.md §6, invariant 1).
//!
//! A lease token is a bearer secret for one claim of one job, held by the node's lease
//! manager and never handed to applications: its `Debug` output is redacted so it never lands
//! in logs. Its first 16 hex digits are public: the claim's [`ClaimId`], which names the
//! claim in logs, spans, events and error entries; the 32 after them are the secret every
//! guarded write presents.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::new_job::check_name;

/// Longest node id: **255** characters.
pub const MAX_NODE_ID_LEN: usize = 255;

/// One process's identity, stored in `lease_owner`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(String);

impl NodeId {
    /// A node id from a name (host name, pod name, …).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `node_id` when it is empty, too long or has control
    /// characters.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        check_name("node_id", &name, MAX_NODE_ID_LEN)?;
        Ok(NodeId(name))
    }

    /// A fresh random node id (`node-` and 12 hex digits).
    pub fn random() -> Self {
        NodeId(format!(
            "node-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ))
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn from_stored(s: String) -> Self {
        NodeId(s)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The random token of one claim. Every renew and finalize by the holder presents it; a
/// holder whose token no longer matches (its lease expired and the job was reclaimed) is told
/// `LeaseLost`. Its form is the claim's [`ClaimId`] (16 hex digits, public) followed by 128
/// random bits (32 hex digits, the secret).
///
/// Engine-internal: no public signature takes or returns one (applications see the
/// [`ClaimId`]); jobvisor's own tests reach it through `testing::internal`.
#[doc(hidden)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken {
    /// The stored form, shared: a token is cloned several times per job (claim, supervisor,
    /// handler context, outcome, finalize batch), and a clone must not allocate.
    text: std::sync::Arc<str>,
    /// Its claim id, read once (`None` for an older 32-digit token).
    claim: Option<ClaimId>,
}

/// Hex digits of a token's public part, its [`ClaimId`].
const CLAIM_ID_LEN: usize = 16;
/// Hex digits of a token: the claim id and the secret (older builds wrote the secret alone).
const TOKEN_LEN: usize = CLAIM_ID_LEN + 32;

impl LeaseToken {
    /// A fresh random token: a random claim id and 128 random bits.
    pub fn generate() -> Self {
        let (claim, _) = uuid::Uuid::new_v4().as_u64_pair();
        LeaseToken::of(format!("{claim:016x}{}", uuid::Uuid::new_v4().simple()))
    }

    /// Parses a stored token.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `lease_token` unless it is 48 lowercase hex digits (or
    /// 32, as older builds wrote them).
    pub fn parse(s: &str) -> Result<Self> {
        if (s.len() == TOKEN_LEN || s.len() == 32)
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(LeaseToken::of(s.to_string()))
        } else {
            Err(Error::invalid(
                "lease_token",
                format!(
                    "expected {TOKEN_LEN} lowercase hex digits, got {} characters",
                    s.len()
                ),
            ))
        }
    }

    /// A token of `text`, its claim id read once.
    fn of(text: String) -> Self {
        LeaseToken {
            claim: ClaimId::of_token(&text),
            text: text.into(),
        }
    }

    /// The stored form; only the store and the holder should ever need it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The claim this token belongs to (none for a token of an older build, whose digits are
    /// all secret).
    pub fn claim_id(&self) -> Option<ClaimId> {
        self.claim
    }

    /// The claim id of a token this build generated (every claim this node makes); an older
    /// build's token, which has none, reads as all zeros.
    pub(crate) fn claim(&self) -> ClaimId {
        self.claim_id().unwrap_or(ClaimId::NONE)
    }
}

/// The identity of one claim of one job: unique per claim, the same for everything that
/// claim's attempt does, and public (it is not the lease token, and gives no way to write as
/// the holder). A job given back unstarted and claimed again keeps its attempt number (the
/// attempt was refunded, ARCHITECTURE.md §7.2) but gets a new claim id, so two executions of
/// "attempt 1" can be told apart in logs, spans, events and the job's error entries.
///
/// ```
/// # fn handler(ctx: jobvisor::JobContext) {
/// tracing::info!(claim = %ctx.claim_id(), "charging");
/// # }
/// ```
///
/// It prints, and serializes, as 16 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimId(u64);

impl ClaimId {
    /// The claim id of a token that has none (an older build's): all zeros.
    pub(crate) const NONE: ClaimId = ClaimId(0);

    /// Its 64 bits.
    pub(crate) fn as_u64(self) -> u64 {
        self.0
    }

    /// The claim id within a stored lease token (its first 16 hex digits), if it has one.
    pub(crate) fn of_token(token: &str) -> Option<Self> {
        if token.len() != TOKEN_LEN {
            return None;
        }
        u64::from_str_radix(token.get(..CLAIM_ID_LEN)?, 16)
            .ok()
            .map(ClaimId)
    }
}

impl fmt::Display for ClaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for ClaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimId({self})")
    }
}

impl std::str::FromStr for ClaimId {
    type Err = Error;

    /// Parses the 16 hex digits [`Display`](fmt::Display) writes.
    fn from_str(s: &str) -> Result<Self> {
        if s.len() == CLAIM_ID_LEN && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            if let Ok(v) = u64::from_str_radix(s, 16) {
                return Ok(ClaimId(v));
            }
        }
        Err(Error::invalid(
            "claim",
            format!("expected {CLAIM_ID_LEN} hex digits, got {s:?}"),
        ))
    }
}

impl Serialize for ClaimId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ClaimId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The public claim id at most: enough to tell two tokens apart in a log, nothing of
        // the secret.
        match self.claim_id() {
            Some(c) => write!(f, "LeaseToken({c}…)"),
            None => write!(f, "LeaseToken({}…)", &self.text[..4.min(self.text.len())]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_debug_is_redacted() {
        let t = LeaseToken::generate();
        let dbg = format!("{t:?}");
        assert!(!dbg.contains(t.as_str()), "{dbg}");
        // The public claim id at most, none of the secret's digits.
        assert!(dbg.contains(&t.claim_id().unwrap().to_string()), "{dbg}");
        assert!(!dbg.contains(&t.as_str()[16..28]), "{dbg}");
    }

    #[test]
    fn a_token_is_its_claim_id_and_a_secret() {
        let t = LeaseToken::generate();
        assert_eq!(t.as_str().len(), 48);
        let c = t.claim_id().unwrap();
        assert_eq!(c.to_string(), &t.as_str()[..16]);
        assert_eq!(c.to_string().parse::<ClaimId>().unwrap(), c);
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            serde_json::json!(c.to_string())
        );
        assert!("xyz".parse::<ClaimId>().is_err());
        assert_ne!(LeaseToken::generate().claim_id(), Some(c), "one per claim");
        let old = LeaseToken::parse(&"a".repeat(32)).unwrap();
        assert_eq!(old.claim_id(), None, "an older build's token is all secret");
    }

    #[test]
    fn token_parse_accepts_only_its_own_format() {
        let t = LeaseToken::generate();
        assert_eq!(LeaseToken::parse(t.as_str()).unwrap(), t);
        assert!(LeaseToken::parse("xyz").is_err());
        assert!(LeaseToken::parse(&"G".repeat(32)).is_err());
    }

    #[test]
    fn node_ids_are_validated() {
        assert!(NodeId::new("web-1").is_ok());
        assert!(NodeId::new("").is_err());
        assert!(NodeId::random().as_str().starts_with("node-"));
    }
}
