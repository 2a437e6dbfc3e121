-- pin: mark an entry as one every view must send, or unmark it.
--
-- KEYS[1] log, KEYS[2] keep, KEYS[3] meta
-- ARGV[1] entry id, ARGV[2] '1' to pin, '0' to unpin
--
-- Race it closes: an entry that a concurrent replace or clear removed is
-- not pinned (the check and the write are one step). System messages stay
-- protected whatever is asked.
--
-- Returns 1 if the entry exists (and is now as asked), 0 if it does not.
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1], 'COUNT', 1) == 0 then
  return 0
end
local kind = redis.call('HGET', KEYS[2], ARGV[1])
if kind == 's' then return 1 end
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[2], ARGV[1], 'p')
  local ttl = redis.call('PTTL', KEYS[3])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1
