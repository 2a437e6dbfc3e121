-- index_prune: take sessions out of their tenant's index, unless touched since.
--
-- KEYS[1] the tenant's sessions (sorted set: session -> last activity, ms)
-- ARGV[1] a time in ms: only members whose score is below it are removed
-- ARGV[2...] the sessions the caller found gone (their meta does not exist)
--
-- Race it closes: the caller checked each session's meta in another slot,
-- then calls this; a session written again meanwhile was touched first (its
-- score moved past ARGV[1]) and stays listed.
--
-- Returns the number removed.
local cutoff = tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < cutoff then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
