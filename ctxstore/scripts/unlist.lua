-- unlist: take sessions that were seen gone out of their tenant's index, unless a write
-- may still create them.
--
-- KEYS[1] index, KEYS[2] pending, KEYS[3] pending_due (as reserve.lua)
-- KEYS[4] deleted   sorted set: deleted session -> when its last keys expire (ms)
-- ARGV[1] t: the sessions were seen gone at or after this time (ms)
-- ARGV[2] a margin for the clocks of other nodes, ms
-- ARGV[3] '1' to remove them whatever is pending (forget_tenant), else '0'
-- ARGV[4] for a delete: when its tombstone expires (ms), recorded in KEYS[4]; else 0
-- then pairs: a session, and its reservation that is spent or given up ('' for none)
--
-- Race it closes: the caller checked each session's keys in another slot
-- (the existence check, a delete or a refused write, at time t or later);
-- a write that creates the session after that check does so under a
-- reservation whose deadline is after t, so a session with such a
-- reservation pending is left listed. One that was seen gone and has none
-- cannot come back unlisted: it is removed.
--
-- Returns the number of sessions removed.
local t = tonumber(ARGV[1])
local margin = tonumber(ARGV[2])
local force = ARGV[3] == '1'
local deleted_until = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. (t - margin))
local removed = 0
for i = 5, #ARGV, 2 do
  local session, spent = ARGV[i], ARGV[i + 1]
  if deleted_until > 0 then redis.call('ZADD', KEYS[4], 'GT', deleted_until, session) end
  local left = keep_pending(KEYS[2], KEYS[3], session, force and math.huge or (t - margin), spent)
  if left == 0 then removed = removed + redis.call('ZREM', KEYS[1], session) end
end
return removed
