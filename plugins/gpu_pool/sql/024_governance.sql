-- Governance (issue 17): team members, freeze windows, versioned request templates and
-- their cross-team approvals. Every change to these is also an event (who, when, before,
-- after), which `gpu-pool audit` reads. Portable SQL for PostgreSQL and SQLite.

-- A person (an Airflow user name) in a team; role 'lead' approves template use and freezes.
CREATE TABLE team_members (
    team TEXT NOT NULL REFERENCES teams (name),
    username TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('member', 'lead')),
    added_by TEXT NOT NULL,
    added_at TIMESTAMP NOT NULL,
    PRIMARY KEY (team, username)
);
CREATE INDEX team_members_by_user ON team_members (username);

-- A window in which a team's quotas, templates and nodes may not change. Active while
-- starts_at <= now < ends_at and not lifted early (lifted_at set before ends_at).
CREATE TABLE freezes (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL REFERENCES teams (name),
    starts_at TIMESTAMP NOT NULL,
    ends_at TIMESTAMP NOT NULL,
    reason TEXT NOT NULL,
    critical_only BOOLEAN NOT NULL DEFAULT FALSE,
    set_by TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    lifted_at TIMESTAMP,
    lifted_by TEXT,
    CHECK (ends_at > starts_at)
);
CREATE INDEX freezes_by_team ON freezes (team, ends_at);

-- Every version of every template is kept; the highest version is in force.
CREATE TABLE templates (
    name TEXT NOT NULL,
    version INTEGER NOT NULL CHECK (version >= 1),
    team TEXT NOT NULL REFERENCES teams (name),
    fields TEXT NOT NULL,
    comment TEXT,
    restored_from INTEGER,
    created_by TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (name, version)
);

-- Another team's standing approval to use a template (granted by a lead of its team).
CREATE TABLE template_approvals (
    template TEXT NOT NULL,
    team TEXT NOT NULL REFERENCES teams (name),
    approved_by TEXT NOT NULL,
    approved_at TIMESTAMP NOT NULL,
    PRIMARY KEY (template, team)
);

-- The template a GPU task used (name@vN) and its setup command, fixed at admission: the
-- command runs on the node before the task's own, even if the template changes meanwhile.
ALTER TABLE requests ADD COLUMN template TEXT;
ALTER TABLE requests ADD COLUMN setup TEXT;
