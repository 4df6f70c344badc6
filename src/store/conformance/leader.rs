//! Conformance cases. The database's leader: one node of many takes it, keeps it while it
//! renews, loses it to another once its lease runs out (a new term), and its leader-only
//! writes are refused once its term is over.

use super::*;
use crate::store::leader::Leadership;

const LEASE: Duration = Duration::from_secs(10);

/// `node` keeps or takes leadership at `at`, believing it holds `held`.
async fn elect(t: &Bundle, node: &str, held: Option<i64>, at: i64) -> Option<Leadership> {
    t.store
        .leader_keep_or_take(&NodeId::new(node).unwrap(), held, LEASE, t.at(at))
        .await
        .unwrap()
}

/// `node`'s gauges turn as leader under `term` at `at` (a leader-only write).
async fn leader_write(t: &Bundle, node: &str, term: i64, at: i64) -> bool {
    t.store
        .gauges_take_turn(node, Duration::from_secs(1), Some(term), t.at(at))
        .await
        .unwrap()
}

/// Eight nodes race for the row: exactly one leads, under term 1. It renews (same term, the
/// lease moved on) and nobody can take over while its lease runs; once it stops renewing,
/// another node takes over under term 2 — and the old leader can neither renew nor write as
/// leader any more (its term is fenced). A resignation hands over at once; a leader whose
/// lease lapsed must win a new term like anyone else.
pub async fn leadership_is_taken_by_one_renewed_taken_over_after_expiry_and_fenced_by_term(
    b: Backend,
) {
    let t = Bundle::new(b).await;
    assert_eq!(t.store.leader_current(t.at(0)).await.unwrap(), None);

    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = t.store.clone();
        let now = t.at(0);
        tasks.push(tokio::spawn(async move {
            let node = NodeId::new(format!("n{n}")).unwrap();
            let got = store
                .leader_keep_or_take(&node, None, LEASE, now)
                .await
                .unwrap();
            (format!("n{n}"), got)
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (node, got) = task.await.unwrap();
        if let Some(l) = got {
            winners.push((node, l));
        }
    }
    assert_eq!(winners.len(), 1, "exactly one leader: {winners:?}");
    let (a, first) = winners.pop().unwrap();
    assert_eq!((first.term, first.elected), (1, true));
    let now = t.store.leader_current(t.at(1)).await.unwrap().unwrap();
    assert_eq!((now.node.as_str(), now.term), (a.as_str(), 1));
    assert_eq!(now.expires_at, t.at(10).unwrap());
    assert_eq!(now.elected_at, t.at(0).unwrap());

    // Renewed: same term, later expiry; nobody else gets it meanwhile.
    let kept = elect(&t, &a, Some(1), 5).await.unwrap();
    assert_eq!((kept.term, kept.elected), (1, false));
    assert_eq!(elect(&t, "other", None, 14).await, None, "lease runs to 15");
    assert!(leader_write(&t, &a, 1, 14).await, "the leader writes");
    assert!(!leader_write(&t, "other", 1, 30).await, "not the holder");
    assert!(!leader_write(&t, &a, 2, 30).await, "not its term");

    // Silent past its lease: another node takes over under a new term.
    let b2 = elect(&t, "other", None, 15).await.unwrap();
    assert_eq!((b2.term, b2.elected), (2, true));
    // The deposed leader wakes up: no renewal, no take-over, and its writes are refused.
    assert_eq!(elect(&t, &a, Some(1), 16).await, None);
    assert!(!leader_write(&t, &a, 1, 17).await, "term 1 is over");
    assert!(leader_write(&t, "other", 2, 17).await, "term 2 writes");
    let now = t.store.leader_current(t.at(17)).await.unwrap().unwrap();
    assert_eq!((now.node.as_str(), now.term), ("other", 2));

    // Resigning ends the lease now: the next node to try takes over at once.
    let other = NodeId::new("other").unwrap();
    assert!(!t.store.leader_resign(&other, 1, t.at(18)).await.unwrap());
    assert!(t.store.leader_resign(&other, 2, t.at(18)).await.unwrap());
    assert!(!t.store.leader_resign(&other, 2, t.at(18)).await.unwrap());
    assert_eq!(t.store.leader_current(t.at(18)).await.unwrap(), None);
    assert!(!leader_write(&t, "other", 2, 19).await, "resigned");
    let c = elect(&t, "third", None, 18).await.unwrap();
    assert_eq!((c.term, c.elected), (3, true));

    // A leader whose lease lapsed in the database cannot renew it: it wins a new term.
    let again = elect(&t, "third", Some(3), 100).await.unwrap();
    assert_eq!((again.term, again.elected), (4, true));
}
