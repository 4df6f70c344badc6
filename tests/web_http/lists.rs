//! The lists' orders and bounds over HTTP: the run-time order (exact from the claim index
//! for one queue's waiting jobs of one priority, a labelled window otherwise) with keyset
//! paging; a filter on a rare kind stopping at its scan window and linking past it; the dead
//! letters grouped in SQL (exact, or labelled past the limit) and retried by group; each
//! schedule's recent fires linking to their jobs.

use std::sync::Arc;

use chrono::{TimeZone, Utc};
use jobvisor::clock::ManualClock;
use jobvisor::testing::Simulation;
use jobvisor::{handler_fn, JobOutcome, Schedule};
use serde_json::Value;

use super::*;

/// The job ids linked from a jobs table, in page order.
fn ids(body: &str) -> Vec<i64> {
    let Some(table) = body.split("<table id=\"jobs\"").nth(1) else {
        return Vec::new();
    };
    let table = table.split("</table>").next().unwrap();
    table
        .split("<td class=\"num\"><a href=\"/d/jobs/")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().parse().unwrap())
        .collect()
}

/// The `href` of the link with this id, unescaped.
fn link(body: &str, id: &str) -> Option<String> {
    let at = body.find(&format!("id=\"{id}\""))?;
    let tag_start = body[..at].rfind('<')?;
    let tag = &body[tag_start..];
    let href = tag.split("href=\"").nth(1)?.split('"').next()?;
    Some(href.replace("&amp;", "&"))
}

async fn get<S, B>(app: &S, cookie: &str, uri: &str) -> Resp
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let r = call(
        app,
        TestRequest::get()
            .uri(uri)
            .insert_header(("cookie", cookie.to_string())),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.body);
    r
}

pub(crate) async fn run_at_order_exact_or_windowed(b: Backend) {
    let e = env(b).await;
    // 60 waiting jobs whose run times run against their ids (the newest id runs first).
    let base = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
    let jobs: Vec<NewJob> = (0..60)
        .map(|i| {
            NewJob::new("sorted", json!({ "i": i }))
                .queue("sorted")
                .run_at(base + chrono::Duration::seconds(600 - i * 10))
        })
        .collect();
    let made: Vec<i64> = e
        .client
        .enqueue_many(jobs)
        .await
        .unwrap()
        .iter()
        .map(|x| x.id.0)
        .collect();
    let app = app!(e.client, cfg().sort_window(20));
    let (cookie, _) = login(&app, TOKEN).await;
    // Exact: one queue's pending jobs of one priority, from the claim index, paged.
    let r = get(
        &app,
        &cookie,
        "/d/jobs?queue=sorted&state=pending&order=run_at_asc",
    )
    .await;
    assert!(r.body.contains("id=\"run-at-exact\""), "{}", r.body);
    let first = ids(&r.body);
    let expected: Vec<i64> = made.iter().rev().copied().collect();
    assert_eq!(first, expected[..50].to_vec());
    let next = link(&r.body, "next-page").expect("a next page");
    let r = get(&app, &cookie, &next).await;
    assert_eq!(ids(&r.body), expected[50..].to_vec());
    assert!(link(&r.body, "next-page").is_none());
    // Latest first, exact too.
    let r = get(
        &app,
        &cookie,
        "/d/jobs?queue=sorted&state=pending&order=run_at_desc",
    )
    .await;
    assert_eq!(ids(&r.body), made[..50].to_vec());
    // Without a queue and state: the newest 20 ids only, sorted, and labelled so.
    let r = get(&app, &cookie, "/d/jobs?kind=sorted&order=run_at_asc").await;
    assert!(r.body.contains("id=\"run-at-window\""), "{}", r.body);
    assert!(!r.body.contains("id=\"run-at-exact\""));
    let newest20: Vec<i64> = made.iter().rev().take(20).copied().collect();
    assert_eq!(ids(&r.body), newest20);
    // Two priorities in the queue: no single index order, so the window again.
    e.client
        .enqueue(
            NewJob::new("sorted", json!({}))
                .queue("sorted")
                .priority(1)
                .run_at(base),
        )
        .await
        .unwrap();
    let r = get(
        &app,
        &cookie,
        "/d/jobs?queue=sorted&state=pending&order=run_at_asc",
    )
    .await;
    assert!(r.body.contains("id=\"run-at-window\""), "{}", r.body);
    // A bad position is refused with what was expected.
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs?order=run_at_asc&after=12")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(
        r.body.contains("&lt;run_at µs&gt;.&lt;id&gt;"),
        "{}",
        r.body
    );
}

pub(crate) async fn rare_filters_stop_at_their_window(b: Backend) {
    let e = env(b).await;
    let rare = e
        .client
        .enqueue(NewJob::new("rare", json!({})).queue("bulk"))
        .await
        .unwrap()
        .id;
    let common: Vec<NewJob> = (0..30)
        .map(|i| NewJob::new("common", json!({ "i": i })).queue("bulk"))
        .collect();
    e.client.enqueue_many(common).await.unwrap();
    let app = app!(e.client, cfg().scan_window(10));
    let (cookie, _) = login(&app, TOKEN).await;
    let mut uri = "/d/jobs?kind=rare".to_string();
    let mut hops = 0;
    let found = loop {
        let r = get(&app, &cookie, &uri).await;
        let page = ids(&r.body);
        if !page.is_empty() {
            break page;
        }
        assert!(r.body.contains("id=\"scan-window\""), "{}", r.body);
        assert!(r.body.contains("Looked at 10 jobs"), "{}", r.body);
        uri = link(&r.body, "look-further").expect("a link past the window");
        hops += 1;
        assert!(hops < 10, "never reached the rare job");
    };
    assert_eq!(found, vec![rare.0]);
    assert!(hops >= 2, "the window bounded the walk ({hops} hops)");
    // With the default window (far past this table), no label.
    let app = app!(e.client, cfg());
    let (cookie, _) = login(&app, TOKEN).await;
    let r = get(&app, &cookie, "/d/jobs?kind=common").await;
    assert!(!r.body.contains("id=\"scan-window\""), "{}", r.body);
}

pub(crate) async fn dead_letters_group_in_sql(b: Backend) {
    let e = env(b).await;
    let store = e.db.store().await;
    let die = |kind: &'static str, code: &'static str, n: usize| {
        let client = e.client.clone();
        let store = store.clone();
        async move {
            for _ in 0..n {
                client
                    .enqueue(NewJob::new(kind, json!({})).queue("dying").max_attempts(1))
                    .await
                    .unwrap();
                let c = store
                    .job_claim(ClaimParams {
                        queue: "dying".into(),
                        owner: NodeId::new("web-test").unwrap(),
                        limit: 1,
                        kinds: None,
                        lease: Duration::from_secs(60),
                        now: None,
                    })
                    .await
                    .unwrap()
                    .pop()
                    .unwrap();
                store
                    .job_finalize_many(FinalizeParams {
                        items: vec![Finalize::dead(
                            c.id,
                            c.token,
                            JobFailure::new(code, format!("{kind} failed with {code}"), 1),
                        )],
                        now: None,
                    })
                    .await
                    .unwrap();
            }
        }
    };
    die("mail", "smtp", 3).await;
    die("mail", "dns", 2).await;
    die("bill", "smtp", 1).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let r = get(&app, &cookie, "/d/dead").await;
    assert!(r.body.contains("id=\"dead-exact\""), "{}", r.body);
    let rows: Vec<&str> = r.body.split("<tr>").skip(2).collect();
    // Most jobs first: mail/smtp 3, mail/dns 2, then the single ones.
    assert!(
        rows[0].contains(">mail<") && rows[0].contains("<code>smtp</code>"),
        "{}",
        rows[0]
    );
    assert!(rows[0].contains("<td class=\"num\">3</td>"), "{}", rows[0]);
    assert!(rows[1].contains("<code>dns</code>") && rows[1].contains("<td class=\"num\">2</td>"));
    assert!(r.body.contains("mail failed with smtp"));
    assert!(r.body.contains("<code>boom</code>"), "the env's dead job");
    // Past the exact limit: labelled.
    let bounded = app!(e.client, cfg().dead_exact_limit(2));
    let (c2, _) = login(&bounded, TOKEN).await;
    let r = get(&bounded, &c2, "/d/dead").await;
    assert!(r.body.contains("id=\"dead-bounded\""), "{}", r.body);
    // Retry one group: exactly its jobs.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/dead/retry")
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("kind", "mail"),
                ("code", "dns"),
                ("confirm", "yes"),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert!(r.body.contains("2 dead job(s)"), "{}", r.body);
    let r = get(&app, &cookie, "/d/dead").await;
    assert!(!r.body.contains("<code>dns</code>"), "{}", r.body);
    assert!(r.body.contains("<td class=\"num\">3</td>"));
}

pub(crate) async fn schedules_show_recent_fires(b: Backend) {
    let db = Arc::new(TestDb::create(b).await);
    let start = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
    let clock = ManualClock::new(start);
    let minute = Duration::from_secs(60);
    let sim = Simulation::on_store(db.store().await, clock.clone(), "a", move |b| {
        b.handler(
            "tick",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
        )
        .periodic(Schedule::every(
            "every_minute",
            minute,
            NewJob::new("tick", json!({})),
        ))
    })
    .keep(db.clone());
    sim.sync_schedules().await.unwrap();
    sim.elect().await;
    for _ in 0..7 {
        clock.advance(minute);
        sim.elect().await;
        sim.fire_schedules().await.unwrap();
    }
    let all = sim
        .client
        .list(jobvisor::ListParams {
            kind: Some("tick".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(all.len() >= 6, "{} fires", all.len());
    let app = app!(sim.client, cfg());
    let (cookie, _) = login(&app, TOKEN).await;
    let r = get(&app, &cookie, "/d/schedules").await;
    let fires = r.body.split("<ol class=\"fires\">").nth(1).unwrap();
    let fires = fires.split("</ol>").next().unwrap();
    let linked: Vec<i64> = fires
        .split("<a href=\"/d/jobs/")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().parse().unwrap())
        .collect();
    // The five newest fires, newest first, each linking to its job.
    // (A fire's instant is in its key: a retried job's run time moves on.)
    let mut newest: Vec<(String, i64)> = all
        .iter()
        .map(|j| (j.unique_key.clone().unwrap(), j.id.0))
        .collect();
    newest.sort();
    newest.reverse();
    let want: Vec<i64> = newest.iter().take(5).map(|(_, id)| *id).collect();
    assert_eq!(linked, want, "{fires}");
}

/// A schedule added through the dashboard's form is stored for the leader to fire, listed
/// as added at run time with a Remove button (a schedule declared in code has none, and its
/// removal is refused naming it); removed, it is gone and fires no more. A bad form is
/// refused, naming the field.
pub(crate) async fn runtime_schedules_are_added_and_removed(b: Backend) {
    let db = Arc::new(TestDb::create(b).await);
    let start = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
    let clock = ManualClock::new(start);
    let minute = Duration::from_secs(60);
    let sim = Simulation::on_store(db.store().await, clock.clone(), "a", move |b| {
        b.handler(
            "tick",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
        )
        .periodic(Schedule::every(
            "in_code",
            minute,
            NewJob::new("tick", json!({})),
        ))
    })
    .keep(db.clone());
    sim.sync_schedules().await.unwrap();
    let app = app!(sim.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let post = |uri: &'static str, form: Vec<(&'static str, &'static str)>| {
        let mut form = form;
        form.push(("csrf", csrf.as_str()));
        TestRequest::post()
            .uri(uri)
            .insert_header(("cookie", cookie.clone()))
            .set_form(form)
    };
    let r = get(&app, &cookie, "/d/schedules").await;
    assert!(r.body.contains("id=\"schedule-add\""), "{}", r.body);
    assert!(!r.body.contains("Remove"), "a code schedule has no Remove");

    let r = call(
        &app,
        post(
            "/d/schedules/add",
            vec![
                ("name", "added"),
                ("every", "1m"),
                ("kind", "report"),
                ("queue", "reports"),
                ("payload", r#"{"team": 7}"#),
                ("missed", "skip"),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("schedule added added: every 1m"),
        "{}",
        r.body
    );
    let listed = sim.client.schedules().await.unwrap();
    let added = listed.iter().find(|s| s.name == "added").unwrap();
    assert_eq!(
        (added.origin, added.queue.as_str(), added.missed),
        (
            jobvisor::ScheduleOrigin::Runtime,
            "reports",
            jobvisor::MissedFires::Skip
        )
    );
    clock.advance(minute);
    sim.elect().await;
    sim.fire_schedules().await.unwrap();
    let reports = || async {
        sim.client
            .list(jobvisor::ListParams {
                kind: Some("report".into()),
                ..Default::default()
            })
            .await
            .unwrap()
    };
    let fired = reports().await;
    assert_eq!(fired.len(), 1, "the leader fires it");
    assert_eq!(fired[0].payload, json!({"team": 7}));
    let r = get(&app, &cookie, "/d/schedules").await;
    assert_eq!(r.body.matches(">Remove</button>").count(), 1, "{}", r.body);
    assert!(r.body.contains("(run time)"), "{}", r.body);

    for (form, text) in [
        (
            vec![("name", "x"), ("kind", "report"), ("cron", "61 * * * *")],
            "invalid cron expression",
        ),
        (vec![("name", "x"), ("kind", "report")], "invalid cron"),
        (
            vec![
                ("name", "x"),
                ("kind", "report"),
                ("every", "1m"),
                ("payload", "{"),
            ],
            "invalid payload",
        ),
        (
            vec![("name", "in_code"), ("kind", "report"), ("every", "1m")],
            "declared in code",
        ),
    ] {
        let r = call(&app, post("/d/schedules/add", form)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.body.contains(text), "{text}: {}", r.body);
    }
    let r = call(&app, post("/d/schedules/remove", vec![("name", "in_code")])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body.contains("declared in code"), "{}", r.body);

    // A node whose code declares a schedule of that name: not stored, and the page says so.
    assert!(!r.body.contains("shadows the one in code"), "{}", r.body);
    let other = Simulation::on_store(db.store().await, clock.clone(), "b", move |b| {
        b.handler(
            "tick",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
        )
        .periodic(Schedule::every(
            "added",
            minute,
            NewJob::new("tick", json!({})),
        ))
    });
    other.sync_schedules().await.unwrap();
    let r = get(&app, &cookie, "/d/schedules").await;
    assert!(
        r.body.contains("shadows the one in code (declared"),
        "{}",
        r.body
    );
    let listed = sim.client.schedules().await.unwrap();
    let added = listed.iter().find(|s| s.name == "added").unwrap();
    assert_eq!(
        (added.origin, added.shadowed_at.is_some()),
        (jobvisor::ScheduleOrigin::Runtime, true)
    );
    drop(other);

    let r = call(&app, post("/d/schedules/remove", vec![("name", "added")])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("schedule added removed"), "{}", r.body);
    let r = get(&app, &cookie, "/d/schedules").await;
    assert!(!r.body.contains("Remove</button>"), "{}", r.body);
    clock.advance(5 * minute);
    sim.elect().await;
    sim.fire_schedules().await.unwrap();
    assert_eq!(reports().await.len(), 1, "removed: no more fires");
}
