-- the keyword context reads the episodes right before / after one in its session
DROP INDEX IF EXISTS memories_session_order_idx;
CREATE INDEX IF NOT EXISTS memories_session_turns_idx
    ON memories (tenant, session, occurred_at, created_at, id) WHERE type = 'episode';
