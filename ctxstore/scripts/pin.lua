-- pin: mark an entry as one every view must send, or unmark it.
--
-- KEYS[1] log, KEYS[2] keep (entry id -> kind, tokens, call ids, result ids and
--         a copy of the message, joined by \x1e), KEYS[3] meta
-- ARGV[1] entry id, ARGV[2] '1' to pin, '0' to unpin
-- ARGV[3] quota: the most bytes in the session (0: none)
-- ARGV[4] quota: appends per second (0: none): a pin counts as one write
-- ARGV[5] quota: the burst that rate allows
-- An entry of the chain (lineage.py: older than the live log, a fork's) is pinned with
-- its values given: ARGV[6] the chain they were read from, ARGV[7] the message (sealed
-- for this session), ARGV[8] its tokens, ARGV[9] call ids, ARGV[10] result ids.
--
-- Race it closes: an entry that a concurrent replace or clear removed is
-- not pinned (the check and the write are one step). System messages stay
-- protected whatever is asked. The pinned copy is stored beside the entry:
-- its bytes count against the session's byte quota (and an unpin gives
-- them back), so a pin is refused when the copy would not fit.
--
-- Each change bumps meta 'kv' (the keep hash's version), which tells a pod's
-- cached view that its copy of the protected messages is stale.
--
-- Returns {1} if the entry exists (and is now as asked), {0} if it does not (or is in the
-- chain and its values were not given, or were read from another chain), or
-- {'quota', name, limit, value}.
local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1], 'COUNT', 1)[1]
local f
if found then
  f = row_fields(found)
elseif ARGV[6] and ARGV[6] ~= '' and redis.call('HGET', KEYS[3], 'chain') == ARGV[6] then
  f = {m = ARGV[7], t = ARGV[8], c = ARGV[9], r = ARGV[10]}
else
  return {0}
end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held and string.sub(held, 1, 1) == 's' then return {1} end
local size = #f['m']
if ARGV[2] == '1' then
  if held then return {1} end
  local bytes = (tonumber(redis.call('HGET', KEYS[3], 'bytes')) or 0) + size
  local refusal = size_refusal(bytes, 0, tonumber(ARGV[3]), 0)
  if not refusal then refusal = take_rate(KEYS[3], 1, tonumber(ARGV[4]), tonumber(ARGV[5])) end
  if refusal then return refusal end
  redis.call('HSET', KEYS[2], ARGV[1], keep_value('p', f['t'], f['c'] or '', f['r'] or '', f['m']))
  redis.call('HSET', KEYS[3], 'bytes', bytes)
  redis.call('HINCRBY', KEYS[3], 'kv', 1)
  local ttl = redis.call('PTTL', KEYS[3])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
elseif held then
  redis.call('HDEL', KEYS[2], ARGV[1])
  local left = (tonumber(redis.call('HGET', KEYS[3], 'bytes')) or 0) - size
  redis.call('HSET', KEYS[3], 'bytes', math.max(0, left))  -- never below nothing
  redis.call('HINCRBY', KEYS[3], 'kv', 1)
end
return {1}
