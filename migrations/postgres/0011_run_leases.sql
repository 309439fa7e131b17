-- Runs are owned by the replica executing them, through a lease: `owner` is the replica's id
-- (made fresh at every start), `lease_expires_at` is pushed forward by the owner's heartbeat.
-- A run whose lease expired (its replica died) is taken over by another replica's sweeper; a
-- run without an owner was stored but not yet started (or by a release before leases).
ALTER TABLE runs ADD COLUMN owner UUID;
ALTER TABLE runs ADD COLUMN lease_expires_at TIMESTAMPTZ;
-- Set by the owner while the run's body waits for its user's input, so a replica that does not
-- execute the run can tell whether input is wanted (409 otherwise).
ALTER TABLE runs ADD COLUMN awaiting_input BOOLEAN NOT NULL DEFAULT FALSE;
-- Pushed forward by followers reading the run through a replica that does not execute it, so
-- the owner's no-reader watchdog counts readers on every replica.
ALTER TABLE runs ADD COLUMN read_until TIMESTAMPTZ;
CREATE INDEX runs_owner ON runs(owner) WHERE status = 'running';

-- Cancels and inputs for a run, written by whichever replica received them and taken by the
-- run's owner (which polls, and on PostgreSQL is woken by NOTIFY mnemo_run_commands).
CREATE TABLE run_commands (
    id          UUID PRIMARY KEY,
    run_id      UUID NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    kind        TEXT NOT NULL,
    payload     JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX run_commands_run ON run_commands(run_id);
