-- The keyword context reads the two episodes right before (or after) one in its session and
-- owner. With the owner in the key (coalesce: an unset user or agent is never '', which
-- Ident forbids), that is an ordered scan of two entries. Keyed by session alone, the owner
-- is a filter the planner expects never to match when agent_id is NULL, so it reads every
-- earlier episode of the session (a bitmap scan, then a sort) and a stored turn costs more
-- the longer its session is (docs/benchmarks.md, "eighth session").
DROP INDEX IF EXISTS memories_session_turns_idx;
CREATE INDEX IF NOT EXISTS memories_session_owner_turns_idx
    ON memories (
        tenant, session, coalesce(user_id, ''), coalesce(agent_id, ''),
        occurred_at, created_at, id
    )
    WHERE type = 'episode';
