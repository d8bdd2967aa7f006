-- PostgreSQL part of the store: events, and the guards the database enforces by itself.
--
-- Invariant: gpus.allocated_milli = sum(milli) of the active allocation_gpus rows of that GPU,
-- kept by gpu_pool_hold_gpu() on every insert, update and delete of allocation_gpus. With the
-- CHECK (allocated_milli BETWEEN 0 AND 1000) on gpus, no writer (the Store, a second
-- scheduler, a raw INSERT) can hold more than one GPU's worth of a GPU. Concurrent writers
-- serialise on the gpus row lock the trigger's UPDATE takes, so the check sees committed sums.

CREATE TABLE events (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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

CREATE FUNCTION gpu_pool_hold_gpu() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.active THEN
            UPDATE gpus SET allocated_milli = allocated_milli - OLD.milli
             WHERE node = OLD.node AND idx = OLD.gpu_index;
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF NEW.active THEN
            UPDATE gpus SET allocated_milli = allocated_milli + NEW.milli
             WHERE node = NEW.node AND idx = NEW.gpu_index;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'allocation of GPU %/% that does not exist', NEW.node, NEW.gpu_index
                    USING ERRCODE = 'foreign_key_violation';
            END IF;
        END IF;
        RETURN NEW;
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER allocation_gpus_hold
    AFTER INSERT OR UPDATE OR DELETE ON allocation_gpus
    FOR EACH ROW EXECUTE FUNCTION gpu_pool_hold_gpu();

CREATE FUNCTION gpu_pool_refuse_held_gpu_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.allocated_milli > 0 THEN
        RAISE EXCEPTION 'GPU %/% is held by an active allocation', OLD.node, OLD.idx
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER gpus_refuse_held_delete
    BEFORE DELETE ON gpus
    FOR EACH ROW EXECUTE FUNCTION gpu_pool_refuse_held_gpu_delete();

CREATE FUNCTION gpu_pool_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only' USING ERRCODE = 'integrity_constraint_violation';
END $$;

CREATE TRIGGER ledger_append_only
    BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION gpu_pool_ledger_append_only();
