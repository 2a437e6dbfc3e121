-- rewrite: replace or clear a session's history, fenced by the lease.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] keep, KEYS[4] view, KEYS[5] lease
-- ARGV[1] our lease token
-- ARGV[2] our fence
-- ARGV[3] now in ms, or '' to use the Redis server's clock
-- ARGV[4] expected seq, or ''
-- ARGV[5] default TTL in ms, or ''
-- ARGV[6] n, the number of new messages
-- ARGV[7] quota: the most bytes in the session (0: none)
-- ARGV[8] quota: the most tokens in the session (0: none)
-- then 7 per message:
--         data, tokens, kind ('s', 'p' or ''), call ids, result ids (joined by \x1f),
--         preview ('' or JSON), preview tokens
--
-- Races it closes: the write is refused unless the lease is still ours
-- (same token, same fence, not expired), so a holder that paused past its
-- expiry cannot clobber its successor; the epoch is bumped and the cached
-- summary dropped in the same step, so a summary worker that read the old
-- history is refused at its commit. A retry of a rewrite that was applied
-- (connection lost before the reply) is recognised by the lease token and
-- answered again, not applied twice. Appends ordered before this script
-- belong to the superseded history; appends after it land in the new one.
--
-- Returns {'ok', epoch, seq, count, superseded, ids...}, {'lease_lost'},
-- {'conflict', current seq} or {'quota', name, limit, value}.
local n = tonumber(ARGV[6])
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'seq', 'count', 'ttl', 'commit', 'commit_res')
if meta[5] == ARGV[1] then
  local e, s, c, sup = string.match(meta[6], '^(%d+) (%d+) (%d+) (%d+)$')
  local out = {'ok', tonumber(e), tonumber(s), tonumber(c), tonumber(sup)}
  for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', n)) do
    table.insert(out, entry[1])
  end
  return out
end

if not lease_held(KEYS[5], ARGV[1], ARGV[2], now_ms(ARGV[3])) then
  return {'lease_lost'}
end
local seq = tonumber(meta[2]) or 0
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= seq then
  return {'conflict', seq}
end

local PER, FIRST = 7, 8
local new_bytes, new_tokens = 0, 0
for i = 1, n do
  local base = FIRST + (i - 1) * PER
  new_bytes = new_bytes + #ARGV[base + 1]
  new_tokens = new_tokens + tonumber(ARGV[base + 2])
end
local refusal = size_refusal(new_bytes, new_tokens, tonumber(ARGV[7]), tonumber(ARGV[8]))
if refusal then return refusal end

local superseded = tonumber(meta[3]) or 0
local epoch = (tonumber(meta[1]) or 0) + 1
seq = seq + 1
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
local out = {'ok', epoch, seq, n, superseded}
local tokens = 0
local first_id, last_id = '', ''
for i = 1, n do
  local base = FIRST + (i - 1) * PER
  local t = tonumber(ARGV[base + 2])
  local id = add_entry(KEYS[1], KEYS[3], ARGV[base + 1], t, ARGV[base + 3], ARGV[base + 4],
                       ARGV[base + 5], ARGV[base + 6], ARGV[base + 7])
  if i == 1 then first_id = id end
  last_id = id
  tokens = tokens + t
  table.insert(out, id)
end
redis.call('HSET', KEYS[2], 'epoch', epoch, 'seq', seq, 'count', n, 'tokens', tokens,
           'bytes', new_bytes,
           'first_id', first_id, 'last_id', last_id, 'wm', '', 'wm_tokens', 0, 'sq', '0',
           'commit', ARGV[1], 'commit_res', epoch .. ' ' .. seq .. ' ' .. n .. ' ' .. superseded)
redis.call('DEL', KEYS[5])

local ttl = tonumber(meta[4]) or tonumber(ARGV[5])
if ttl and ttl > 0 then
  for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ttl) end
end
return out
