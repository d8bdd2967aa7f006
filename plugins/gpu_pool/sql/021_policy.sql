-- The sharing policy as versioned documents (gpu_pool.store.policy).
-- Portable SQL for PostgreSQL and SQLite; times are db time text (gpu_pool.store.codec).

-- One row per version ever set; rows are never updated or deleted. The latest version is
-- the policy in force; no row at all means the defaults (Policy()). A restore is a new
-- version whose document is an older one's (restored_from names it).
CREATE TABLE policy_versions (
    version INTEGER PRIMARY KEY CHECK (version >= 1),
    document TEXT NOT NULL,                -- the YAML document as it was given
    actor TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    comment TEXT,
    restored_from INTEGER REFERENCES policy_versions (version)
);
