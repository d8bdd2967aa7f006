-- Events are read by subject alone (`gpu-pool why`, the UI's history of one request or node);
-- events_by_subject leads with subject_kind, so it cannot serve that read.
CREATE INDEX events_by_subject_only ON events (subject, id);
