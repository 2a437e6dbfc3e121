-- session_reserve: put a session in its tenant's index, within the tenant's session quota.
--
-- KEYS[1] the tenant's sessions (sorted set: session -> last activity, ms)
-- ARGV[1] session id
-- ARGV[2] now, ms (the score)
-- ARGV[3] the most sessions the tenant may have (0: no limit)
--
-- Race it closes: count-then-add in one step, so concurrent first writes of
-- new sessions cannot take the tenant past its quota. The tenant's keys share
-- one slot, so this runs beside (not inside) the session's own scripts; the
-- SDK runs it before the first write of a session it has not seen. Sessions
-- that expired are not counted once the SDK has pruned them (it checks their
-- keys, which live in other slots, then runs index_prune) and asked again.
--
-- Returns {1} or {0, the number of sessions}.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  return {1}
end
local cap = tonumber(ARGV[3])
if cap > 0 then
  local count = redis.call('ZCARD', KEYS[1])
  if count >= cap then return {0, count} end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return {1}
