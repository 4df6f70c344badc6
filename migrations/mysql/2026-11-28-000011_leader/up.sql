-- The leader of this database: one row, id 1. A node leads while it holds the row's lease
-- (`expires_at`, epoch µs); it renews it with a guarded UPDATE (its own name and term), and
-- another node may take it over only once the lease has expired — one guarded UPDATE that
-- raises `term`. Leader-only work carries its term and is refused once the term is over,
-- so a deposed leader that wakes up late cannot act as leader. Nothing about job leases
-- reads this table.
CREATE TABLE jobvisor_leader (
    id         INTEGER PRIMARY KEY,
    holder     VARCHAR(255) NULL,
    term       BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    elected_at BIGINT NOT NULL
);
INSERT INTO jobvisor_leader (id, holder, term, expires_at, elected_at) VALUES (1, NULL, 0, 0, 0);
