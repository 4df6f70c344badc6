//! Conformance cases for deploy-safe claiming and the node registry: a claim takes only the
//! kinds its node runs (so a rolling deploy burns no attempt), and due jobs that no live node
//! can run are named, with why.

use std::time::Duration;

use serde_json::json;

use super::Bundle;
use crate::error::Error;
use crate::job::{JobState, NewJob};
use crate::lease::NodeId;
use crate::store::{Backend, ClaimParams, UnservedReason};

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_string()).collect()
}

pub async fn claims_take_only_the_kinds_their_node_runs(b: Backend) {
    let t = Bundle::new(b).await;
    let mut ids = Vec::new();
    for kind in ["a", "b", "c", "b", "a"] {
        ids.push((
            kind,
            t.enqueue(NewJob::new(kind, json!(kind)).max_attempts(1), 0)
                .await,
        ));
    }
    let claim = |kinds: Option<Vec<String>>| ClaimParams {
        queue: "default".into(),
        owner: NodeId::new("old-node").unwrap(),
        limit: 10,
        kinds,
        lease: Duration::from_secs(30),
        now: t.at(1),
    };
    // A node whose handlers are none of these claims nothing.
    let none = t.store.job_claim(claim(Some(Vec::new()))).await.unwrap();
    assert!(none.is_empty(), "{none:?}");
    // An old node without `b`: it takes `a` and `c`, never `b`.
    let got = t
        .store
        .job_claim(claim(Some(names(&["a", "c"]))))
        .await
        .unwrap();
    let mut kinds: Vec<&str> = got.iter().map(|c| c.kind.as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["a", "a", "c"]);
    for (kind, id) in &ids {
        let j = t.get(*id).await;
        if *kind == "b" {
            assert_eq!(
                j.state,
                JobState::Pending,
                "{kind}: left for a node that runs it"
            );
            assert_eq!(j.attempts, 0, "{kind}: no attempt burnt");
        } else {
            assert_eq!(j.state, JobState::Running, "{kind}");
        }
    }
    // A new node with `b` gets them, on their first attempt.
    let got = t
        .store
        .job_claim(claim(Some(names(&["a", "b", "c"]))))
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|c| c.kind == "b" && c.attempts == 1));
}

pub async fn jobs_no_live_node_can_run_are_named_with_why(b: Backend) {
    let t = Bundle::new(b).await;
    let node = NodeId::new("n1").unwrap();
    let (hour, minute) = (Duration::from_secs(3600), Duration::from_secs(60));
    // n1 serves queue `q1` with a handler for `a` only.
    t.store
        .node_heartbeat(&node, &names(&["q1"]), &names(&["a"]), None, t.at(0))
        .await
        .unwrap();
    let listed = t.store.nodes_list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].node, "n1");
    assert_eq!(listed[0].queues, ["q1"]);
    assert_eq!(listed[0].kinds, ["a"]);
    assert_eq!(Some(listed[0].heartbeat_at), t.at(0));
    for (queue, kind, at) in [
        ("q1", "a", 0),
        ("q1", "b", 0),
        ("q1", "b", 5),
        ("q2", "a", 0),
    ] {
        t.enqueue(NewJob::new(kind, json!(null)).queue(queue), at)
            .await;
    }
    // A job due in the future is not waiting yet.
    t.enqueue(
        NewJob::new("b", json!(null)).queue("q1").delay(hour * 24),
        0,
    )
    .await;

    // At +2 min, for jobs due at least a minute: (q1, b) has no handler anywhere, q2 has no
    // node; (q1, a) is served.
    let mut got = t
        .store
        .unserved_jobs(minute, hour, t.at(120))
        .await
        .unwrap();
    got.sort_by(|x, y| (&x.queue, &x.kind).cmp(&(&y.queue, &y.kind)));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].queue.as_str(), got[0].kind.as_str()), ("q1", "b"));
    assert_eq!(got[0].reason, UnservedReason::NoNodeHasKind);
    assert_eq!(got[0].jobs, 2);
    assert_eq!(Some(got[0].oldest_due), t.at(0));
    assert_eq!((got[1].queue.as_str(), got[1].kind.as_str()), ("q2", "a"));
    assert_eq!(got[1].reason, UnservedReason::NoNodeServesQueue);
    assert_eq!(got[1].jobs, 1);

    // Jobs due less than `after` ago are not reported yet.
    let soon = t.store.unserved_jobs(hour, hour, t.at(120)).await.unwrap();
    assert!(soon.is_empty(), "{soon:?}");

    // A second node brings `b`: only q2 is left.
    let n2 = NodeId::new("n2").unwrap();
    t.store
        .node_heartbeat(&n2, &names(&["q1"]), &names(&["a", "b"]), None, t.at(60))
        .await
        .unwrap();
    let got = t
        .store
        .unserved_jobs(minute, hour, t.at(120))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].queue, "q2");

    // Heartbeats older than the live window do not count: two hours on, nothing is served.
    let later = t
        .store
        .unserved_jobs(minute, hour, t.at(7200))
        .await
        .unwrap();
    assert_eq!(
        later.len(),
        3,
        "every waiting group, (q1, a) too: {later:?}"
    );
    assert!(later
        .iter()
        .all(|u| u.reason == UnservedReason::NoNodeServesQueue));

    // A heartbeat keeps the first start; unregistering removes the row.
    t.store
        .node_heartbeat(&n2, &names(&["q1"]), &names(&["a", "b"]), None, t.at(90))
        .await
        .unwrap();
    let n2_row = t
        .store
        .nodes_list()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.node == "n2")
        .unwrap();
    assert_eq!(Some(n2_row.started_at), t.at(60));
    assert_eq!(Some(n2_row.heartbeat_at), t.at(90));
    t.store.node_unregister(&n2).await.unwrap();
    let left: Vec<String> = t
        .store
        .nodes_list()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.node)
        .collect();
    assert_eq!(left, ["n1"]);

    // Rows silent for a day are forgotten by the next check.
    t.store
        .unserved_jobs(minute, hour, t.at(2 * 86_400))
        .await
        .unwrap();
    assert!(t.store.nodes_list().await.unwrap().is_empty());

    // A zero live window is refused by name.
    match t.store.unserved_jobs(minute, Duration::ZERO, t.at(0)).await {
        Err(Error::InvalidInput { field, .. }) => assert_eq!(field, "live"),
        other => panic!("{other:?}"),
    }
}
