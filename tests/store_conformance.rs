//! The store conformance suite, run unchanged against every backend. PostgreSQL and MariaDB
//! must be reachable (`JOBVISOR_PG_URL`, `JOBVISOR_MYSQL_URL`, default: the local services):
//! a missing server fails these tests, it never skips them. `simulated` runs the suite
//! against the fleet simulation's store (`tests/fleet_sim/`): SQLite on tmpfs, its calls
//! inline on one thread, a fault plan asked before every guarded operation.

mod postgres {
    jobvisor::conformance_tests!(jobvisor::Backend::Postgres);

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn claim_statement_takes_nothing_without_its_own_lock() {
        jobvisor::store::conformance::postgres_claim_statement_takes_nothing_without_its_own_lock()
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_abandoned_controlled_claim_takes_nothing_when_the_lock_frees() {
        jobvisor::store::conformance::postgres_an_abandoned_controlled_claim_takes_nothing_when_the_lock_frees()
            .await;
    }
}

mod mysql {
    jobvisor::conformance_tests!(jobvisor::Backend::Mysql);
}

mod sqlite {
    jobvisor::conformance_tests!(jobvisor::Backend::Sqlite);
}

mod simulated {
    jobvisor::conformance_tests!(simulated);

    /// The cases above ran through the simulation's fault seam, not around it.
    #[test]
    fn the_fault_plan_is_asked_before_each_guarded_operation() {
        jobvisor::testing::simulated_store(true);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let b = jobvisor::store::conformance::Bundle::new(jobvisor::Backend::Sqlite).await;
            let before = jobvisor::testing::simulated_store_ops();
            b.enqueue(
                jobvisor::NewJob::new("k", serde_json::json!({})).queue("q"),
                0,
            )
            .await;
            assert_eq!(b.claim("q", "n1", 1, 0).await.len(), 1);
            assert_eq!(jobvisor::testing::simulated_store_ops(), before + 2);
        });
    }
}
