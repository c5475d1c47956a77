-- memory model: fact keys for temporal facts, sessions with memory off.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS fact_key text;
CREATE INDEX IF NOT EXISTS memories_fact_idx
    ON memories (tenant, coalesce(user_id, ''), coalesce(agent_id, ''), fact_key)
    WHERE fact_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_expiry_idx ON memories (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_created_idx ON memories (tenant, agent_id, created_at);

CREATE TABLE IF NOT EXISTS memory_off (
    tenant   text NOT NULL,
    session  text NOT NULL,
    owner_key text NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, owner_key, session)
);
