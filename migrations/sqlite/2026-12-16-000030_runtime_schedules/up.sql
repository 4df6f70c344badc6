-- Where each schedule comes from: 'code' (declared on a node's builder, synced at its start,
-- retired once no node declares it) or 'runtime' (added through the client, the CLI or the
-- dashboard, changed and removed the same way). A node's sync and its retirement touch code
-- rows only, so a deploy never overwrites or retires a schedule added at run time; the leader
-- fires both alike.
ALTER TABLE jobvisor_schedules ADD COLUMN origin VARCHAR(16) NOT NULL DEFAULT 'code';
