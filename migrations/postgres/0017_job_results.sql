-- What a finished job did (for a turn: the memories it stored or changed), written in the
-- same statement that marks the job done; NULL for jobs finished before this column existed.
ALTER TABLE jobs ADD COLUMN result JSONB;
-- The turn's job is found from its run (`GET /v1/runs/{id}/memory`).
CREATE INDEX jobs_run ON jobs(run_id);
