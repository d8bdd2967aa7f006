-- Fleet chores (gpu_pool.ops): notices sent, reclaim records, snapshot exports.
-- Portable SQL for PostgreSQL and SQLite; times are ISO-8601 UTC text ('2026-12-01T12:00:00+00:00').

-- One row per notice ever claimed. The primary key makes "never twice" a database fact:
-- kind (quota_expiring, quota_expired, budget, run_past_expiry, idle_gpus), subject (a quota
-- id or a request name), threshold (days or percent; 0 when none), ref (what the notice is
-- about: the expiry instant, the budget period start, the allocation start).
CREATE TABLE IF NOT EXISTS ops_notifications (
    kind VARCHAR(40) NOT NULL,
    subject VARCHAR(300) NOT NULL,
    threshold INTEGER NOT NULL,
    ref VARCHAR(64) NOT NULL,
    team VARCHAR(200) NOT NULL,
    status VARCHAR(16) NOT NULL,          -- sending | sent | covered
    channels VARCHAR(100) NOT NULL DEFAULT '',
    title TEXT NOT NULL DEFAULT '',
    claimed_at VARCHAR(40) NOT NULL,
    sent_at VARCHAR(40),
    PRIMARY KEY (kind, subject, threshold, ref)
);

-- What the reclaim sweep did or found: released a dead task's GPUs, warned or ended an idle
-- allocation, reported a process gpu-pool did not start.
CREATE TABLE IF NOT EXISTS ops_reclaims (
    id VARCHAR(64) PRIMARY KEY,
    at VARCHAR(40) NOT NULL,
    action VARCHAR(32) NOT NULL,          -- released | idle_warned | idle_ended | foreign_process
    request_name VARCHAR(300) NOT NULL DEFAULT '',
    team VARCHAR(200) NOT NULL DEFAULT '',
    node VARCHAR(200) NOT NULL,
    gpu_indices VARCHAR(200) NOT NULL DEFAULT '',
    gpus DOUBLE PRECISION NOT NULL DEFAULT 0,
    held_since VARCHAR(40),
    held_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
    idle_gpu_hours DOUBLE PRECISION NOT NULL DEFAULT 0,
    reason TEXT NOT NULL,
    actor VARCHAR(200) NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_ops_reclaims_at ON ops_reclaims (at);

-- One row per exported snapshot period; the latest period of a dataset is where the next
-- run resumes, so missed periods are caught up.
CREATE TABLE IF NOT EXISTS ops_exports (
    dataset VARCHAR(40) NOT NULL,          -- daily | monthly_report
    period VARCHAR(20) NOT NULL,           -- 2026-12-01 or 2026-12
    exported_at VARCHAR(40) NOT NULL,
    object_keys TEXT NOT NULL,
    row_count INTEGER NOT NULL,
    PRIMARY KEY (dataset, period)
);
