-- A document's identity and content (PostgreSQL): ingesting the same file again is a no-op,
-- and a changed file replaces the chunks of its document instead of adding a second one.
-- `content_hash`: sha256 (lowercase hex) of the bytes ingested; NULL for documents ingested
-- before this migration, which are replaced by the next ingest of their source.
-- `generation`: how many ingests claimed the row; an ingest claims it by a compare-and-set on
-- this number, so of two concurrent ingests of one document only one writes it.
-- `ingested_at`: when the claiming ingest had written every chunk; NULL while it writes them
-- (or when it died doing so: the next ingest of that document then writes it again).
ALTER TABLE documents ADD COLUMN content_hash TEXT;
ALTER TABLE documents ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
ALTER TABLE documents ADD COLUMN ingested_at TIMESTAMPTZ;
UPDATE documents SET ingested_at = created_at;
-- One document per user and source; without a source, one per user and content. Documents
-- from before content hashes (duplicates among them) stay outside both until replaced.
CREATE UNIQUE INDEX documents_user_source ON documents(user_id, source)
    WHERE source IS NOT NULL AND content_hash IS NOT NULL;
CREATE UNIQUE INDEX documents_user_content ON documents(user_id, content_hash)
    WHERE source IS NULL AND content_hash IS NOT NULL;
-- Finding a source's documents, those from before content hashes included.
CREATE INDEX documents_user_source_lookup ON documents(user_id, source);
