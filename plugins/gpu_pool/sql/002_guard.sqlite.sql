-- SQLite part of the store: events, and the guards the database enforces by itself.
--
-- Invariant: gpus.allocated_milli = sum(milli) of the active allocation_gpus rows of that GPU,
-- kept by the allocation_gpus_* triggers on every insert, update and delete. With the
-- CHECK (allocated_milli BETWEEN 0 AND 1000) on gpus, no writer (the Store or a raw INSERT)
-- can hold more than one GPU's worth of a GPU. SQLite has one writer at a time, so the
-- triggers always see committed sums.

CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TIMESTAMP NOT NULL,
    subject_kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_by_subject ON events (subject_kind, subject, id);
CREATE INDEX events_by_at ON events (at);

CREATE TRIGGER allocation_gpus_exists
    BEFORE INSERT ON allocation_gpus
    WHEN NEW.active
     AND NOT EXISTS (SELECT 1 FROM gpus WHERE node = NEW.node AND idx = NEW.gpu_index)
BEGIN
    SELECT RAISE(ABORT, 'allocation of a GPU that does not exist');
END;

CREATE TRIGGER allocation_gpus_exists_on_update
    BEFORE UPDATE OF active, milli, node, gpu_index ON allocation_gpus
    WHEN NEW.active
     AND NOT EXISTS (SELECT 1 FROM gpus WHERE node = NEW.node AND idx = NEW.gpu_index)
BEGIN
    SELECT RAISE(ABORT, 'allocation of a GPU that does not exist');
END;

CREATE TRIGGER allocation_gpus_hold
    AFTER INSERT ON allocation_gpus
    WHEN NEW.active
BEGIN
    UPDATE gpus SET allocated_milli = allocated_milli + NEW.milli
     WHERE node = NEW.node AND idx = NEW.gpu_index;
END;

CREATE TRIGGER allocation_gpus_change
    AFTER UPDATE OF active, milli, node, gpu_index ON allocation_gpus
BEGIN
    UPDATE gpus SET allocated_milli = allocated_milli - OLD.milli
     WHERE OLD.active AND node = OLD.node AND idx = OLD.gpu_index;
    UPDATE gpus SET allocated_milli = allocated_milli + NEW.milli
     WHERE NEW.active AND node = NEW.node AND idx = NEW.gpu_index;
END;

CREATE TRIGGER allocation_gpus_drop
    AFTER DELETE ON allocation_gpus
    WHEN OLD.active
BEGIN
    UPDATE gpus SET allocated_milli = allocated_milli - OLD.milli
     WHERE node = OLD.node AND idx = OLD.gpu_index;
END;

CREATE TRIGGER gpus_refuse_held_delete
    BEFORE DELETE ON gpus
    WHEN OLD.allocated_milli > 0
BEGIN
    SELECT RAISE(ABORT, 'GPU is held by an active allocation');
END;

CREATE TRIGGER ledger_append_only_update
    BEFORE UPDATE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only');
END;

CREATE TRIGGER ledger_append_only_delete
    BEFORE DELETE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only');
END;
