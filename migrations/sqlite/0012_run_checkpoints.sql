-- What a run's new owner needs to continue it after a takeover (its replica died, or the server
-- restarted): a JSON document written by the run's owner — how the run's body is rebuilt (the
-- chat turn's message, the research's request without secrets), the attempt number, the results
-- of the steps it finished and the run's last event when they were saved.
ALTER TABLE runs ADD COLUMN checkpoint TEXT;
