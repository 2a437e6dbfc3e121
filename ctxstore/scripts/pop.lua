-- pop: take the newest message off a session, in one step, and return it.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] keep, KEYS[4] view, KEYS[5] anchor,
-- KEYS[6] idem, KEYS[7] idem_old (where this call's reply is recorded),
-- KEYS[8] checkpoints, KEYS[9] checkpoint summaries (a checkpoint at the message taken
-- goes with it: it points at nothing)
-- ARGV[1] this call's id (random, the same on every retry of the call)
-- ARGV[2] idempotency period, ms: how long this call's reply is kept for a retry
-- ARGV[3] quota: appends per second (0: none): a pop counts as one write
-- ARGV[4] quota: the burst that rate allows
-- When the live log is empty and the history goes on in the chain (a fork's), the caller
-- is answered {'base', chain} and calls again with: ARGV[5] that chain, ARGV[6] its newest
-- entry's id, ARGV[7] its message (sealed for this session), ARGV[8] its tokens,
-- ARGV[9] the chain without it, ARGV[10] the entry before it ('' for none).
--
-- Races it closes: two pods popping at once take two different messages
-- (read and delete are one step), and an append racing the pop is either
-- the one popped or left alone, never half-counted. A retry of a pop whose
-- reply was lost is answered with the message it took, never takes a
-- second one. The history is no longer append-only, so the epoch is bumped
-- (a paged reader stops, a summary job that read it is refused at commit)
-- and the views' anchors are dropped; the cached summary is kept (moved to
-- the new epoch) unless it covers the popped message.
--
-- Returns {1, entry id, seq, epoch, data, tokens}, {0} when the session is empty
-- (or absent), {'base', chain} or {'quota', name, limit, value}.
local prev = recorded(KEYS[6], KEYS[7], ARGV[1])
if prev then
  if prev == '' then return {0} end
  local id, seq, epoch, tokens, data = string.match(prev, '^(%S+) (%d+) (%d+) (%d+) (.*)$')
  return {1, id, tonumber(seq), tonumber(epoch), data, tonumber(tokens)}
end
local period = tonumber(ARGV[2])
local meta = redis.call('HMGET', KEYS[2], 'seq', 'epoch', 'count', 'tokens', 'bytes', 'wm',
                        'wm_tokens', 'chain', 'base')
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 2)
local base = meta[9] or ''
if not meta[1] or (#newest == 0 and base == '') then
  record(KEYS[6], ARGV[1], '', period)
  return {0}
end
-- The live log is empty but the history goes on in the chain (lineage.py): the caller
-- reads the chain's newest entry and calls again with it, if the chain is still this one.
local in_chain = #newest == 0
if in_chain and (ARGV[5] == '' or ARGV[5] ~= (meta[8] or '')) then
  return {'base', meta[8] or ''}
end
local refusal = take_rate(KEYS[2], 1, tonumber(ARGV[3]), tonumber(ARGV[4]))
if refusal then return refusal end

local id, f, size, last_id
if in_chain then
  id, f, size, last_id = ARGV[6], {m = ARGV[7], t = ARGV[8]}, 0, ARGV[10]
  redis.call('HSET', KEYS[2], 'chain', ARGV[9], 'base', ARGV[10])
else
  id, f = newest[1][1], row_fields(newest[1])
  size = #f['m'] + #(f['v'] or '')
  last_id = newest[2] and newest[2][1] or base
  redis.call('XDEL', KEYS[1], id)
end
if redis.call('HDEL', KEYS[3], id) == 1 then size = size + #f['m'] end  -- its keep copy

local seq = tonumber(meta[1]) + 1
local epoch = (tonumber(meta[2]) or 0) + 1
local count = math.max(0, (tonumber(meta[3]) or 1) - 1)
local tokens = math.max(0, (tonumber(meta[4]) or 0) - tonumber(f['t']))
redis.call('HSET', KEYS[2], 'seq', seq, 'epoch', epoch, 'count', count, 'tokens', tokens,
           'bytes', math.max(0, (tonumber(meta[5]) or 0) - size), 'last_id', last_id)
if count == 0 then redis.call('HSET', KEYS[2], 'first_id', '') end

-- Did the summary cover it?
if meta[6] and meta[6] ~= '' and not id_before(meta[6], id) then
  redis.call('UNLINK', KEYS[4])
  redis.call('HSET', KEYS[2], 'wm', '', 'wm_tokens', 0)
elseif redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('HSET', KEYS[4], 'epoch', epoch)
end
redis.call('UNLINK', KEYS[5])
local checkpoints = redis.call('HGETALL', KEYS[8])
for j = 1, #checkpoints, 2 do
  local ok, point = pcall(cjson.decode, checkpoints[j + 1])
  if ok and type(point) == 'table' and point.entry_id == id then
    drop_checkpoint(KEYS[2], KEYS[8], KEYS[9], checkpoints[j])
  end
end
record(KEYS[6], ARGV[1], id .. ' ' .. seq .. ' ' .. epoch .. ' ' .. f['t'] .. ' ' .. f['m'], period)
return {1, id, seq, epoch, f['m'], tonumber(f['t'])}
