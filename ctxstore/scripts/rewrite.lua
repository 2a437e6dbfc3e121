-- rewrite: replace or clear a session's history, fenced by the lease.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] keep, KEYS[4] view, KEYS[5] lease, KEYS[6] gone,
-- KEYS[7] anchor (the views' anchors: a new history starts with none),
-- KEYS[8] idem, KEYS[9] idem_old (where this call's reply is recorded)
-- KEYS[10] index (the search index: the history it covers is gone)
-- KEYS[11] checkpoints, KEYS[12] checkpoint summaries, KEYS[13] branches (they point
-- into the history this one supersedes: gone with it)
-- ARGV[1] our lease token
-- ARGV[2] our fence
-- ARGV[3] now in ms, or '' to use the Redis server's clock
-- ARGV[4] expected seq, or ''
-- ARGV[5] default TTL in ms, or ''
-- ARGV[6] n, the number of new messages
-- ARGV[7] quota: the most bytes in the session (0: none)
-- ARGV[8] quota: the most tokens in the session (0: none)
-- ARGV[9] this call's id (random, the same on every retry of the call)
-- ARGV[10] quota: appends per second (0: none); the n messages count as n appends
--          (a clear as one)
-- ARGV[11] quota: the burst that rate allows
-- ARGV[12] the index reservation this write may create the session under ('' for none)
-- ARGV[13] that reservation's deadline, ms
-- ARGV[14] idempotency period, ms: how long this call's reply is kept for a retry
-- then 7 per message:
--         data, tokens, kind ('s', 'p' or ''), call ids, result ids (joined by \x1f),
--         preview ('' or JSON), preview tokens
--
-- Races it closes: the write is refused unless the lease is still ours
-- (same token, same fence, not expired), so a holder that paused past its
-- expiry cannot clobber its successor; the epoch is bumped and the cached
-- summary dropped in the same step, so a summary worker that read the old
-- history is refused at its commit. A lease is consumed by the write (the
-- script deletes it), so another call with it is refused as lease_lost. A
-- retry of the same call (its id), whose reply was lost, is answered with
-- the reply recorded for it, whatever other pods did since (appended,
-- replaced, cleared or deleted). Appends ordered before this script belong
-- to the superseded history; appends after it land in the new one.
--
-- Returns {'ok', epoch, seq, count, superseded, segments the old history read ('owner:id,...'
-- or '-'), ids...}, {'lease_lost', fresh 0/1, now},
-- {'conflict', current seq, fresh 0/1, now}, {'quota', name, limit, value, fresh, now}
-- or {'reserve'}.
local n = tonumber(ARGV[6])
local prev = recorded(KEYS[8], KEYS[9], ARGV[9])
if prev then
  local out = {'ok'}
  for word in string.gmatch(prev, '%S+') do
    table.insert(out, tonumber(word) or word)
  end
  return out
end
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'seq', 'count', 'ttl')
local now = now_ms(ARGV[3])
if not lease_held(KEYS[5], ARGV[1], ARGV[2], now) then
  return {'lease_lost', meta[2] and 0 or 1, now}
end
local seq = tonumber(meta[2])
local epoch = tonumber(meta[1]) or 0
local creating = seq == nil
local bucket = nil
if creating then
  local refusal
  refusal, epoch, seq, bucket = creation(KEYS[6], ARGV[12], ARGV[13], now)
  if refusal then return refusal end
end
local is_new = creating and 1 or 0
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= seq then
  return {'conflict', seq, is_new, now}
end

local PER, FIRST = 7, 14
local new_bytes, new_tokens = 0, 0
for i = 1, n do
  local base = FIRST + (i - 1) * PER
  local size = #ARGV[base + 1]
  if ARGV[base + 3] ~= '' then size = size * 2 end  -- and its keep copy
  size = size + #ARGV[base + 6]  -- and a large tool result's preview
  new_bytes = new_bytes + size
  new_tokens = new_tokens + tonumber(ARGV[base + 2])
end
local refusal = size_refusal(new_bytes, new_tokens, tonumber(ARGV[7]), tonumber(ARGV[8]))
if not refusal then
  refusal = take_rate(KEYS[2], math.max(n, 1), tonumber(ARGV[10]), tonumber(ARGV[11]),
                      bucket)
end
if refusal then
  table.insert(refusal, is_new)
  table.insert(refusal, now)
  return refusal
end
if creating then created(KEYS[2], KEYS[6], ARGV[12]) end

local superseded = tonumber(meta[3]) or 0
epoch = epoch + 1
seq = seq + 1
-- The segments the old history read (lineage.py) are the caller's to release.
local segments = held_segments(KEYS[2], KEYS[13])
-- The log is emptied, not deleted: a stream keeps the last id it gave, so the new history's
-- ids come after every id of the old one (an id kept from before, a recall tool's or a
-- caller's, never names a message of the new history, even within the same millisecond).
redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)  -- none there: nothing made
redis.call('UNLINK', KEYS[3], KEYS[4], KEYS[7], KEYS[10], KEYS[11], KEYS[12], KEYS[13])
redis.call('HDEL', KEYS[2], 'chain', 'base', 'origin')
local out = {'ok', epoch, seq, n, superseded, segments}
local tokens = 0
local first_id, last_id = '', ''
for i = 1, n do
  local base = FIRST + (i - 1) * PER
  local t = tonumber(ARGV[base + 2])
  local id = add_entry(KEYS[1], KEYS[3], ARGV[base + 1], t, ARGV[base + 3], ARGV[base + 4],
                       ARGV[base + 5], ARGV[base + 6], ARGV[base + 7], i, tokens + t)
  if i == 1 then first_id = id end
  last_id = id
  tokens = tokens + t
  table.insert(out, id)
end
redis.call('HSET', KEYS[2], 'epoch', epoch, 'seq', seq, 'count', n, 'tokens', tokens,
           'bytes', new_bytes,
           'first_id', first_id, 'last_id', last_id, 'wm', '', 'wm_tokens', 0, 'sq', '0')
record(KEYS[8], ARGV[9], table.concat(out, ' ', 2), tonumber(ARGV[14]))
redis.call('UNLINK', KEYS[5])

local ttl = tonumber(meta[4]) or tonumber(ARGV[5])
if ttl and ttl > 0 then
  for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ttl) end
end
return out
