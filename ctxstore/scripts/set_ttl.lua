-- set_ttl: give an existing session its own TTL, or none, in one step.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] keep, KEYS[4] view, KEYS[5] anchor, KEYS[6] index,
-- KEYS[7] checkpoints, KEYS[8] checkpoint summaries, KEYS[9] branches
-- ARGV[1] the TTL in ms, or 0 for none (the session never expires, whatever
--         the tenant's default)
--
-- Race it closes: the check that the session exists and the change are one
-- step, so a missing session gets no meta (which a concurrent first append
-- would inherit). The TTL is kept in meta, where every write reads it (0
-- included: "none" outlives the next write); the lease and the idempotency
-- keys keep their own expiry.
--
-- The segments its history starts in (lineage.py) are the caller's to stretch: it gets
-- the session's chain back, and its branches' records (whose segments a rewind gave the
-- TTL then in force), read in this step rather than in a round trip of their own.
--
-- Returns {1, chain ('' for none), branch record...}, or {0} when the session does not exist.
if redis.call('HEXISTS', KEYS[2], 'seq') == 0 then return {0} end
local ttl = tonumber(ARGV[1])
redis.call('HSET', KEYS[2], 'ttl', ttl)
for _, key in ipairs(KEYS) do
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) else redis.call('PERSIST', key) end
end
local out = redis.call('HVALS', KEYS[9])
table.insert(out, 1, redis.call('HGET', KEYS[2], 'chain') or '')
table.insert(out, 1, 1)
return out
