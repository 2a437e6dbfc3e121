-- anchor: move a view's anchor for one budget, if nobody moved it since it was read.
--
-- KEYS[1] anchor  hash: <budget> -> "epoch start level tokens covers made stamp",
--                 <budget>:s -> the body of the summary that view sends
-- KEYS[2] meta
-- ARGV[1] the budget (cl100k tokens), the field
-- ARGV[2] the stamp of the anchor the caller read ('' for none)
-- ARGV[3] the new anchor's value (as above)
-- ARGV[4] the new anchor's summary body ('' for none)
-- ARGV[5] the epoch the caller read
-- ARGV[6] the most anchors a session keeps (budgets): the oldest made goes first
--
-- Race it closes: pods that find a view full at the same time each plan a
-- step; exactly one moves the anchor (compare-and-set on the stamp), and
-- the others get its anchor back and send the same bytes. An anchor planned
-- on a history that a replace or clear has since superseded is refused.
--
-- Returns {'ok'}, {'moved', value, summary body} or {'stale'}.
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'seq')
if not meta[2] or (meta[1] or '0') ~= ARGV[5] then return {'stale'} end
local current = redis.call('HGET', KEYS[1], ARGV[1])
local stamp = current and string.match(current, '(%S+)$') or ''
if stamp ~= ARGV[2] then
  return {'moved', current or '', redis.call('HGET', KEYS[1], ARGV[1] .. ':s') or ''}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1] .. ':s', ARGV[4])
else
  redis.call('HDEL', KEYS[1], ARGV[1] .. ':s')
end
-- One anchor per budget in use, a few at most: the one made longest ago goes.
local made = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not string.find(field, ':') then
    local value = redis.call('HGET', KEYS[1], field)
    table.insert(made, {tonumber(string.match(value, '^%S+ %S+ %S+ %S+ %S+ (%d+)')) or 0, field})
  end
end
if #made > tonumber(ARGV[6]) then
  table.sort(made, function(a, b) return a[1] < b[1] end)
  for i = 1, #made - tonumber(ARGV[6]) do
    redis.call('HDEL', KEYS[1], made[i][2], made[i][2] .. ':s')
  end
end
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
return {'ok'}
