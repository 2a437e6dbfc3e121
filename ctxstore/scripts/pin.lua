-- pin: mark an entry as one every view must send, or unmark it.
--
-- KEYS[1] log, KEYS[2] keep (entry id -> kind, tokens, call ids, result ids and
--         a copy of the message, joined by \x1e), KEYS[3] meta
-- ARGV[1] entry id, ARGV[2] '1' to pin, '0' to unpin
--
-- Race it closes: an entry that a concurrent replace or clear removed is
-- not pinned (the check and the write are one step). System messages stay
-- protected whatever is asked.
--
-- Returns 1 if the entry exists (and is now as asked), 0 if it does not.
local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1], 'COUNT', 1)[1]
if not found then return 0 end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held and string.sub(held, 1, 1) == 's' then return 1 end
if ARGV[2] == '1' then
  local f = {}
  for j = 1, #found[2], 2 do f[found[2][j]] = found[2][j + 1] end
  redis.call('HSET', KEYS[2], ARGV[1], keep_value('p', f['t'], f['c'] or '', f['r'] or '', f['m']))
  local ttl = redis.call('PTTL', KEYS[3])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1
