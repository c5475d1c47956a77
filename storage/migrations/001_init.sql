-- memstream schema v1: memories (record of truth), append-only audit events.
CREATE TABLE IF NOT EXISTS memories (
    id               uuid PRIMARY KEY,
    tenant           text NOT NULL,
    user_id          text,
    agent_id         text,
    app              text,
    project          text,
    session          text NOT NULL,
    run_id           text,
    scope            text NOT NULL,
    type             text NOT NULL,
    content          text NOT NULL,
    content_hash     text NOT NULL,
    salience         real NOT NULL DEFAULT 0.5,
    confidence       real NOT NULL DEFAULT 1.0,
    importance       real NOT NULL DEFAULT 0.5,
    outcome          real,
    pinned           boolean NOT NULL DEFAULT false,
    access_count     integer NOT NULL DEFAULT 0,
    last_accessed_at timestamptz,
    source_event_ids text[] NOT NULL DEFAULT '{}',
    metadata         jsonb NOT NULL DEFAULT '{}'::jsonb,
    redactions       jsonb NOT NULL DEFAULT '{}'::jsonb,
    occurred_at      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz,
    valid_from       timestamptz,
    valid_to         timestamptz,
    superseded_by    uuid,
    deleted_at       timestamptz,
    indexed          boolean NOT NULL DEFAULT false,
    tsv              tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED
);

CREATE INDEX IF NOT EXISTS memories_owner_idx ON memories (tenant, user_id, agent_id, session);
CREATE INDEX IF NOT EXISTS memories_tsv_idx ON memories USING gin (tsv);
CREATE INDEX IF NOT EXISTS memories_unindexed_idx ON memories (tenant) WHERE NOT indexed AND deleted_at IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS memories_owner_hash_idx
    ON memories (tenant, coalesce(user_id, ''), coalesce(agent_id, ''), type, content_hash);

-- What happened to memories. No content, no PII: ids, kinds, counts.
CREATE TABLE IF NOT EXISTS memory_events (
    seq        bigserial PRIMARY KEY,
    event_key  text NOT NULL UNIQUE,   -- idempotency: one row per (memory, kind, cause)
    tenant     text NOT NULL,
    memory_id  uuid,
    kind       text NOT NULL,          -- stored, merged, forgotten, expired, pinned ...
    at         timestamptz NOT NULL DEFAULT now(),
    detail     jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS memory_events_memory_idx ON memory_events (tenant, memory_id);

CREATE OR REPLACE FUNCTION memory_events_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'memory_events is append-only';
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS memory_events_no_update ON memory_events;
CREATE TRIGGER memory_events_no_update BEFORE UPDATE OR DELETE ON memory_events
    FOR EACH ROW EXECUTE FUNCTION memory_events_append_only();
