-- import_commit: make an imported session appear, whole, from its staging keys.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] keep, KEYS[4] view, KEYS[5] gone, KEYS[6] idem,
-- KEYS[7] idem_old (where this call's reply is recorded), KEYS[8] checkpoints,
-- KEYS[9] checkpoint summaries, KEYS[10] the staging log, KEYS[11] the staging keep hash
-- ARGV[1] this call's id (random, the same on every retry of the call)
-- ARGV[2] the index reservation this write may create the session under ('' for none)
-- ARGV[3] that reservation's deadline, ms
-- ARGV[4] now in ms, or '' to use the Redis server's clock
-- ARGV[5] default TTL in ms, or ''
-- ARGV[6] idempotency period, ms
-- ARGV[7] quota: the most bytes (0: none), ARGV[8] the most tokens (0: none)
-- ARGV[9] quota: appends per second (0: none): an import counts as one write
-- ARGV[10] quota: the burst that rate allows
-- ARGV[11] the import's digest (what it holds: importing it again changes nothing)
-- ARGV[12] messages, ARGV[13] their tokens, ARGV[14] the bytes staged
-- ARGV[15] the first entry's id, ARGV[16] the last one's ('' for none)
-- ARGV[17] the summary's watermark ('' for none), ARGV[18] the tokens it covers (unused:
--          they are read from the staged entry, as a checkpoint's counters are)
-- ARGV[19] s, then s pairs: the summary's fields (sealed for this session)
-- then c, then per checkpoint: id, its entry, its record (JSON), f, f pairs (its summary)
--
-- Races it closes: the session appears in one step, history, pins, summary and
-- checkpoints together, or not at all: a pod never reads half an import. The
-- counters of checkpoints and summaries are the staged entries' (a crafted line
-- cannot give a fork false counts), and a checkpoint's summary covers only entries
-- up to it. It is
-- created only if it does not exist (an import never writes over a session;
-- one that holds this very import is answered 'unchanged'), and only under a
-- live reservation of the tenant's index. Every checkpoint's entry and the
-- summary's watermark must be entries of the import. A retry of a call whose
-- reply was lost is answered with its first reply. The staging keys go in
-- every case but a missing reservation.
--
-- Returns {'ok', epoch, seq}, {'unchanged', 0, now}, {'exists', 0, now},
-- {'missing', what, fresh 1, now}, {'quota', name, limit, value, fresh, now} or {'reserve'}.
local prev = recorded(KEYS[6], KEYS[7], ARGV[1])
if prev then
  local status, epoch, seq = string.match(prev, '^(%S+) (%d+) (%d+)$')
  return {status, tonumber(epoch), tonumber(seq)}
end
local now = now_ms(ARGV[4])
local meta = redis.call('HMGET', KEYS[2], 'seq', 'import')
if meta[1] then
  redis.call('UNLINK', KEYS[10], KEYS[11])
  if meta[2] == ARGV[11] then return {'unchanged', 0, now} end
  return {'exists', 0, now}
end
local refusal, epoch, seq, bucket = creation(KEYS[5], ARGV[2], ARGV[3], now)
if refusal then return refusal end

local function gone(what)
  redis.call('UNLINK', KEYS[10], KEYS[11])
  return {'missing', what, 1, now}
end
-- The history's messages and tokens up to staged entry `id` ({'0', '0'} for ''), or nil.
local function counts(id)
  if id == '' then return {'0', '0'} end
  local rows = redis.call('XRANGE', KEYS[10], id, id)
  if #rows == 0 then return nil end
  local f = row_fields(rows[1])
  return {f['n'], f['k']}
end
local wm_tokens = '0'
if ARGV[17] ~= '' then
  local at_wm = counts(ARGV[17])
  if not at_wm then return gone('summary') end
  wm_tokens = at_wm[2]
end
local summary, at = given_pairs(ARGV, 19)
local points, sums, last_point = {}, {}, 0
local bytes = tonumber(ARGV[14])
for _ = 1, tonumber(ARGV[at]) do
  local id, entry, body, f = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], tonumber(ARGV[at + 4])
  local here = counts(entry)
  if not here then return gone(id) end
  -- Its counters are the history's there, not what the line claims (a fork takes them).
  local point = cjson.decode(body)
  point.count, point.tokens = here[1], here[2]
  if point.covers ~= '' then
    local covered = counts(point.covers)
    if not covered or id_before(entry, point.covers) then return gone(id) end
    point.wm_tokens = covered[2]
  end
  body = cjson.encode(point)
  table.insert(points, id)
  table.insert(points, body)
  bytes = bytes + #body
  for j = 1, f do
    table.insert(sums, id .. ':' .. ARGV[at + 4 + 2 * j - 1])
    table.insert(sums, ARGV[at + 4 + 2 * j])
    bytes = bytes + #ARGV[at + 4 + 2 * j]
  end
  last_point = math.max(last_point, tonumber(string.match(id, '(%d+)$')) or 0)
  at = at + 4 + 2 * f
end
refusal = size_refusal(bytes, tonumber(ARGV[13]), tonumber(ARGV[7]), tonumber(ARGV[8]))
if not refusal then
  refusal = take_rate(KEYS[2], 1, tonumber(ARGV[9]), tonumber(ARGV[10]), bucket)
end
if refusal then
  redis.call('UNLINK', KEYS[10], KEYS[11])
  table.insert(refusal, 1)
  table.insert(refusal, now)
  return refusal
end
created(KEYS[2], KEYS[5], ARGV[2])

redis.call('UNLINK', KEYS[1], KEYS[3], KEYS[4], KEYS[8], KEYS[9])
if redis.call('EXISTS', KEYS[10]) == 1 then redis.call('RENAME', KEYS[10], KEYS[1]) end
if redis.call('EXISTS', KEYS[11]) == 1 then redis.call('RENAME', KEYS[11], KEYS[3]) end
if #summary > 0 then
  redis.call('HSET', KEYS[4], unpack(summary))
  redis.call('HSET', KEYS[4], 'epoch', epoch)
end
if #points > 0 then redis.call('HSET', KEYS[8], unpack(points)) end
if #sums > 0 then redis.call('HSET', KEYS[9], unpack(sums)) end
seq = seq + 1
redis.call('HSET', KEYS[2], 'seq', seq, 'epoch', epoch, 'count', ARGV[12], 'tokens', ARGV[13],
           'bytes', bytes, 'first_id', ARGV[15], 'last_id', ARGV[16], 'wm', ARGV[17],
           'wm_tokens', wm_tokens, 'sq', '0', 'cp_n', last_point, 'import', ARGV[11])
redis.call('HINCRBY', KEYS[2], 'kv', 1)
local ttl = tonumber(ARGV[5])
for _, k in ipairs({1, 2, 3, 4, 8, 9}) do
  if ttl and ttl > 0 then redis.call('PEXPIRE', KEYS[k], ttl) else redis.call('PERSIST', KEYS[k]) end
end
record(KEYS[6], ARGV[1], 'ok ' .. epoch .. ' ' .. seq, tonumber(ARGV[6]))
return {'ok', epoch, seq}
