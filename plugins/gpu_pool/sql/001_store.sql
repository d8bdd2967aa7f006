-- The gpu-pool store: fleet, quotas, requests, allocations, ledger (portable part).
--
-- Conventions, both dialects:
--   * ids are application-generated text (uuid4 hex); names are the user-facing keys;
--   * TIMESTAMP columns hold naive UTC (the Python side converts to and from aware UTC);
--   * JSON is stored as TEXT;
--   * enums are TEXT with a CHECK listing the values of gpu_pool.model.
-- The double-allocation guard (gpus.allocated_milli maintained by triggers), the append-only
-- ledger and the events table are dialect-specific: see 002_guard.{postgresql,sqlite}.sql.

CREATE TABLE teams (
    name TEXT PRIMARY KEY,
    notify_email TEXT,
    notify_webhook TEXT,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL
);

CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    zone TEXT NOT NULL,
    tier TEXT NOT NULL CHECK (tier IN ('core', 'edge')),
    ssh_conn_id TEXT,
    cpu_milli INTEGER NOT NULL CHECK (cpu_milli >= 0),
    memory_mib INTEGER NOT NULL CHECK (memory_mib >= 0),
    bandwidth_mb_s DOUBLE PRECISION NOT NULL CHECK (bandwidth_mb_s >= 0),
    labels TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL CHECK (state IN ('up', 'draining', 'down')),
    state_reason TEXT,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL
);

-- allocated_milli is never written by the application: triggers on allocation_gpus keep it
-- equal to the sum of the active rows' milli, and the CHECK makes over-allocation fail.
CREATE TABLE gpus (
    node TEXT NOT NULL REFERENCES nodes (name),
    idx INTEGER NOT NULL CHECK (idx >= 0),
    model TEXT NOT NULL,
    memory_mib INTEGER NOT NULL CHECK (memory_mib >= 0),
    healthy BOOLEAN NOT NULL DEFAULT TRUE,
    utilization_pct DOUBLE PRECISION,
    memory_used_mib INTEGER,
    read_at TIMESTAMP,
    allocated_milli INTEGER NOT NULL DEFAULT 0 CHECK (allocated_milli BETWEEN 0 AND 1000),
    PRIMARY KEY (node, idx)
);

CREATE TABLE gpu_samples (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    at TIMESTAMP NOT NULL,
    utilization_pct DOUBLE PRECISION,
    memory_used_mib INTEGER,
    healthy BOOLEAN NOT NULL
);
CREATE INDEX gpu_samples_by_gpu ON gpu_samples (node, gpu_index, at);

CREATE TABLE quotas (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL REFERENCES teams (name),
    purpose TEXT NOT NULL CHECK (purpose IN ('training', 'inference', 'pretraining')),
    gpu_model TEXT,
    gpus DOUBLE PRECISION NOT NULL CHECK (gpus >= 0),
    borrow_limit_gpus DOUBLE PRECISION NOT NULL DEFAULT 0 CHECK (borrow_limit_gpus >= 0),
    gpu_hour_budget DOUBLE PRECISION CHECK (gpu_hour_budget >= 0),
    valid_from TIMESTAMP NOT NULL,
    expires_at TIMESTAMP NOT NULL,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL,
    CHECK (expires_at > valid_from)
);
-- One quota per team, purpose and model (NULL = any model); setting it again renews it.
CREATE UNIQUE INDEX quotas_scope ON quotas (team, purpose, COALESCE(gpu_model, ''));

CREATE TABLE requests (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    team TEXT NOT NULL REFERENCES teams (name),
    purpose TEXT NOT NULL CHECK (purpose IN ('training', 'inference', 'pretraining')),
    priority TEXT NOT NULL CHECK (priority IN ('critical', 'high', 'normal', 'low', 'batch')),
    gpus INTEGER NOT NULL CHECK (gpus >= 0),
    gpu_milli INTEGER NOT NULL CHECK (gpu_milli BETWEEN 1 AND 1000),
    nodes INTEGER NOT NULL CHECK (nodes >= 1),
    gpu_models TEXT NOT NULL DEFAULT '[]',
    min_gpu_memory_mib INTEGER NOT NULL DEFAULT 0 CHECK (min_gpu_memory_mib >= 0),
    cpu_milli INTEGER NOT NULL DEFAULT 0 CHECK (cpu_milli >= 0),
    memory_mib INTEGER NOT NULL DEFAULT 0 CHECK (memory_mib >= 0),
    dataset_uri TEXT,
    dataset_zone TEXT,
    dataset_size_gib DOUBLE PRECISION,
    data_ready BOOLEAN NOT NULL,
    time_limit_s DOUBLE PRECISION,
    estimated_runtime_s DOUBLE PRECISION,
    preemptible BOOLEAN NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('pending', 'running', 'finished', 'cancelled', 'refused')),
    reason_code TEXT,
    reason_message TEXT,
    submitted_at TIMESTAMP NOT NULL,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL,
    finished_at TIMESTAMP,
    -- the Airflow task instance this request stands for (empty for CLI requests)
    dag_id TEXT,
    task_id TEXT,
    run_id TEXT,
    map_index INTEGER,
    try_number INTEGER,
    executor_key TEXT
);
CREATE INDEX requests_by_state ON requests (state, submitted_at);

CREATE TABLE allocations (
    id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL REFERENCES requests (id),
    request_name TEXT NOT NULL,
    node TEXT NOT NULL REFERENCES nodes (name),
    gpu_milli INTEGER NOT NULL CHECK (gpu_milli BETWEEN 0 AND 1000),
    cpu_milli INTEGER NOT NULL CHECK (cpu_milli >= 0),
    memory_mib INTEGER NOT NULL CHECK (memory_mib >= 0),
    team TEXT NOT NULL,
    purpose TEXT NOT NULL,
    priority TEXT NOT NULL,
    gpu_model TEXT,
    preemptible BOOLEAN NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('active', 'released', 'preempted', 'expired')),
    started_at TIMESTAMP NOT NULL,
    ends_by TIMESTAMP,
    ended_at TIMESTAMP,
    end_reason TEXT
);
CREATE INDEX allocations_by_state ON allocations (state, node);
CREATE INDEX allocations_by_request ON allocations (request_id);

-- One row per GPU an allocation holds. No foreign key to gpus: history rows must survive a
-- GPU's removal; the guard triggers check that an active row names an existing GPU.
CREATE TABLE allocation_gpus (
    allocation_id TEXT NOT NULL REFERENCES allocations (id),
    node TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    milli INTEGER NOT NULL CHECK (milli BETWEEN 1 AND 1000),
    active BOOLEAN NOT NULL DEFAULT TRUE,
    PRIMARY KEY (allocation_id, gpu_index)
);
-- A whole GPU is held by at most one active allocation (shares are bounded by the trigger).
CREATE UNIQUE INDEX allocation_gpus_whole ON allocation_gpus (node, gpu_index)
    WHERE active AND milli = 1000;
CREATE INDEX allocation_gpus_by_gpu ON allocation_gpus (node, gpu_index);

-- Append-only (triggers refuse UPDATE and DELETE); one entry per allocation, ever.
CREATE TABLE ledger (
    allocation_id TEXT PRIMARY KEY REFERENCES allocations (id),
    request_name TEXT NOT NULL,
    team TEXT NOT NULL,
    purpose TEXT NOT NULL,
    node TEXT NOT NULL,
    gpu_model TEXT,
    gpus DOUBLE PRECISION NOT NULL CHECK (gpus >= 0),
    started_at TIMESTAMP NOT NULL,
    ended_at TIMESTAMP NOT NULL,
    gpu_hours DOUBLE PRECISION NOT NULL,
    price_per_gpu_hour DOUBLE PRECISION NOT NULL,
    cost DOUBLE PRECISION NOT NULL,
    outcome TEXT NOT NULL
        CHECK (outcome IN ('success', 'failed', 'timed_out', 'preempted', 'reclaimed', 'cancelled')),
    metrics TEXT NOT NULL DEFAULT '{}',
    recorded_at TIMESTAMP NOT NULL,
    CHECK (ended_at >= started_at)
);
CREATE INDEX ledger_by_end ON ledger (ended_at);
