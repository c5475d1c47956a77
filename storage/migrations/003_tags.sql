-- tags on memories (recall filters on them: a memory matches when it has every tag asked for)
ALTER TABLE memories ADD COLUMN IF NOT EXISTS tags text[] NOT NULL DEFAULT '{}';
CREATE INDEX IF NOT EXISTS memories_tags_idx ON memories USING gin (tags);
CREATE INDEX IF NOT EXISTS memories_session_order_idx
    ON memories (tenant, session, created_at) WHERE type = 'episode';
