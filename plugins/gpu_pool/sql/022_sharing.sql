-- Sharing policy (issue 16): lending consents, and what a placement borrowed, when it ran
-- off-peak, its grace and its cross-zone move, kept on the allocation and copied to the
-- ledger when it ends. Portable SQL for PostgreSQL and SQLite (one column per ALTER).

-- A team's standing consent to lend its idle guaranteed GPUs. No row: it lends to every
-- team without limit. lend_to: NULL = every team; otherwise a JSON list of team names
-- ('[]' = nobody). limit_gpus: NULL = no cap on what it lends at once.
CREATE TABLE team_lending (
    team TEXT PRIMARY KEY REFERENCES teams (name),
    lend_to TEXT,
    limit_gpus DOUBLE PRECISION CHECK (limit_gpus >= 0),
    set_by TEXT NOT NULL,
    set_at TIMESTAMP NOT NULL
);

-- borrowed_from: the lender team ('' = capacity no guarantee covers); NULL = within quota.
ALTER TABLE allocations ADD COLUMN borrowed_from TEXT;
ALTER TABLE allocations ADD COLUMN off_peak BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE allocations ADD COLUMN grace_s DOUBLE PRECISION;
ALTER TABLE allocations ADD COLUMN transfer_s DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN expected_wait_saved_s DOUBLE PRECISION NOT NULL DEFAULT 0;

-- The task's own SIGTERM-to-SIGKILL grace; NULL = the policy's preemption_grace.
ALTER TABLE requests ADD COLUMN grace_s DOUBLE PRECISION;

ALTER TABLE ledger ADD COLUMN borrowed_from TEXT;
ALTER TABLE ledger ADD COLUMN off_peak BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE ledger ADD COLUMN transfer_s DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE ledger ADD COLUMN expected_wait_saved_s DOUBLE PRECISION NOT NULL DEFAULT 0;
