-- Versioned facts (fact_put: valid_from set) may hold a content again after a change
-- (A, then B, then A): each version is its own row (its id is derived from the key, the
-- time it is valid from and the content), so the exact-dedupe index leaves them out.
DROP INDEX IF EXISTS memories_owner_hash_idx;
CREATE UNIQUE INDEX IF NOT EXISTS memories_owner_hash_idx
    ON memories (tenant, coalesce(user_id, ''), coalesce(agent_id, ''), type, content_hash)
    WHERE valid_from IS NULL;

-- Vector points to delete, written in the transaction that forgets, erases, supersedes or
-- expires their memory; the deleter (and the reconciler, for what it left) removes the points
-- and then the row. A crash or an index outage between the two writes leaves a row here, never
-- a recallable point of a forgotten memory.
CREATE TABLE IF NOT EXISTS vector_deletes (
    tenant    text NOT NULL,
    memory_id uuid NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, memory_id)
);
-- points of memories forgotten or superseded before this queue existed (erased rows are gone)
INSERT INTO vector_deletes (tenant, memory_id)
    SELECT tenant, id FROM memories WHERE deleted_at IS NOT NULL OR superseded_by IS NOT NULL
    ON CONFLICT DO NOTHING;
