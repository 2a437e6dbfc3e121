-- lease_acquire: take the session's lease, with a new fencing number.
--
-- KEYS[1] lease  hash: token, fence, expires (ms), kind
-- KEYS[2] meta   hash: its 'fence' field only grows, so it outlives the lease key
-- ARGV[1] our token (random, one per lease)
-- ARGV[2] time to live, ms
-- ARGV[3] now in ms, or '' to use the Redis server's clock
-- ARGV[4] our kind: 'write' (replace, clear) or 'summary'
-- ARGV[5] a kind we may take over from while it is live ('summary' for writers), or ''
--
-- Races it closes: check-and-set in one step, so two takers cannot both
-- win; every acquisition gets a larger fence, so a holder that paused past
-- its expiry is refused at commit (the commit compares the fence). A
-- writer may take the lease from a summary worker: the worker's commit is
-- then refused, which is what a replace or clear wants.
--
-- A lease on a session never written leaves a meta holding the fence: it
-- expires with the lease, so an abandoned lease leaves nothing that lasts.
--
-- Returns {1, fence, expires} or {0, holder kind, holder expires}
local now = now_ms(ARGV[3])
local cur = redis.call('HMGET', KEYS[1], 'token', 'expires', 'kind')
if cur[1] and cur[1] ~= ARGV[1] and tonumber(cur[2]) > now then
  if ARGV[5] == '' or cur[3] ~= ARGV[5] then
    return {0, cur[3], tonumber(cur[2])}
  end
end
local ttl = tonumber(ARGV[2])
local fence = redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence, 'expires', now + ttl, 'kind', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ttl)
if redis.call('HEXISTS', KEYS[2], 'seq') == 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return {1, fence, now + ttl}
