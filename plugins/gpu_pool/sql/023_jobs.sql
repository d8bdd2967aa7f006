-- The remote jobs a GPU task started, so that whoever applies a preemption can stop them.
-- Portable SQL for PostgreSQL and SQLite; times are TIMESTAMP as in 001_store.sql.
--
-- One row per job (one per node of the allocation). The operator records its jobs right
-- after starting them; apply.preempt() sets stop_reason/stop_grace_s/stop_requested_at in the
-- same transaction that ends the allocation PREEMPTED (an outbox: a scheduler killed between
-- the commit and the SSH kill leaves the request to stop in the store, and the next cycle of
-- any executor sends it). stop_sent_at: when a detached kill was accepted by the node.
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    request_name TEXT NOT NULL,
    node TEXT NOT NULL,
    ssh_conn_id TEXT NOT NULL,
    base_dir TEXT NOT NULL,
    grace_s DOUBLE PRECISION,             -- the task's own preemption grace, if it set one
    started_at TIMESTAMP NOT NULL,
    stop_reason TEXT,                     -- preempted (set by apply.preempt)
    stop_grace_s DOUBLE PRECISION,
    stop_message TEXT,
    stop_requested_at TIMESTAMP,
    stop_sent_at TIMESTAMP
);
CREATE INDEX IF NOT EXISTS jobs_by_request ON jobs (request_name);
CREATE INDEX IF NOT EXISTS jobs_to_stop ON jobs (stop_requested_at, stop_sent_at);
