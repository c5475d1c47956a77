-- The new memories the store stage wrote whose index points are not written yet. Such a row
-- is inserted with indexed = true and listed here in the same transaction; once its point is
-- written, mark_indexed deletes the entry. Marking the row itself was an UPDATE of the whole
-- wide row: a new version, every index entry again and its tsvector recomputed, about a
-- quarter of PostgreSQL's time during ingest (docs/benchmarks.md, "fifteenth session"). A
-- memory that waits is the same as one with indexed = false: reads report it unindexed and
-- the reconciler indexes it. Every other write that resets the flag (merges, pins, edits)
-- still sets indexed = false.
CREATE TABLE IF NOT EXISTS memories_index_pending (
    id     uuid PRIMARY KEY REFERENCES memories (id) ON DELETE CASCADE,
    tenant text NOT NULL
);
