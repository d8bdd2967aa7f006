-- Start estimates (issue 18): when the last placement cycle expects a pending request to
-- start (gpu_pool.engine.estimate); NULL: no estimate (held by quota, headroom, data or a
-- freeze, beyond the estimated head of the queue, or no known end makes room for it).
-- Written with reason_code/reason_message, cleared with them when the request leaves
-- pending. Portable SQL for PostgreSQL and SQLite.
ALTER TABLE requests ADD COLUMN estimated_start TIMESTAMP;

-- Finished allocations by end, for the run time / time limit ratios the estimates learn.
CREATE INDEX IF NOT EXISTS allocations_by_end ON allocations (ended_at);
