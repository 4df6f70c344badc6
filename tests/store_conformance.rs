//! The store conformance suite, run unchanged against every backend. PostgreSQL and MariaDB
//! must be reachable (`JOBVISOR_PG_URL`, `JOBVISOR_MYSQL_URL`, default: the local services):
//! a missing server fails these tests, it never skips them.

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
