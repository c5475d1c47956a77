-- API keys bound to an owner: a key with a user and/or agent may only act as that owner
-- (the gateway resolves a key to its identity; the worker refuses any other owner)
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS owner_user text;
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS owner_agent text;
