-- tenant credentials: only a hash of each key is kept; the key itself is shown once at creation
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash   text PRIMARY KEY,
    tenant     text NOT NULL,
    name       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX IF NOT EXISTS api_keys_tenant_idx ON api_keys (tenant);
