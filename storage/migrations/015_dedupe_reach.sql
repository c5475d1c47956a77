-- One memory per owner, type, normalised content and reach (pipeline/dedupe.py ``reach``):
-- the same text in another scope, another project (project scope) or another session
-- (session and run scopes) is a memory of its own, which lives as long and reaches the
-- readers its scope says. Rows stored before keep their ids; no two of them share a key here.
DROP INDEX IF EXISTS memories_owner_hash_idx;
CREATE UNIQUE INDEX IF NOT EXISTS memories_owner_hash_idx
    ON memories (
        tenant, coalesce(user_id, ''), coalesce(agent_id, ''), type, content_hash, scope,
        (CASE WHEN scope = 'project' THEN coalesce(project, '')
              WHEN scope IN ('session', 'run') THEN session
              ELSE '' END)
    )
    WHERE valid_from IS NULL;
