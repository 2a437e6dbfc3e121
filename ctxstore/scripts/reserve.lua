-- reserve: list a session in its tenant's index before a write may create it, within the
-- tenant's session quota.
--
-- KEYS[1] index        sorted set: session -> last activity (ms)
-- KEYS[2] pending      hash: session -> the reservations pending for it, "token:deadline,..."
-- KEYS[3] pending_due  sorted set: session -> its latest pending deadline (for clean-up)
-- ARGV[1] session id
-- ARGV[2] now in ms, or '' to use the Redis server's clock
-- ARGV[3] the most sessions the tenant may have (0: no limit)
-- ARGV[4] a token naming this reservation (random)
-- ARGV[5] how long it lasts, ms: a write may create the session until then
-- ARGV[6] a margin for the clocks of other nodes, ms
--
-- Only a write that would create the session asks (its script said so).
--
-- Races it closes: count-then-add in one step, so concurrent first writes of
-- new sessions cannot take the tenant past its quota. The tenant's keys live
-- in another slot than the session's, so listing and creating cannot be one
-- step: the reservation is the bridge. The session's write scripts refuse to
-- create a session without a live reservation, and a session is taken out
-- of the index only when no reservation that could still create it is
-- pending (unlist.lua). So a session that exists is always listed.
--
-- Returns {1, deadline} or {0, the number of sessions}.
local now = now_ms(ARGV[2])
local margin = tonumber(ARGV[6])
for _, s in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - margin),
                              'LIMIT', 0, 100)) do
  keep_pending(KEYS[2], KEYS[3], s, now - margin, '')
end
local cap = tonumber(ARGV[3])
if cap > 0 then
  -- A listed session (gone, or another write's reservation pending) is counted
  -- already; so is one still listed after the cap was lowered below the count.
  local count = redis.call('ZCARD', KEYS[1])
  local listed = redis.call('ZSCORE', KEYS[1], ARGV[1]) and 1 or 0
  if count - listed >= cap then return {0, count - listed} end
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
local deadline = now + tonumber(ARGV[5])
local held = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], (held and (held .. ',') or '') .. ARGV[4] .. ':' .. deadline)
redis.call('ZADD', KEYS[3], 'GT', deadline, ARGV[1])  -- GT still adds a new member
return {1, deadline}
