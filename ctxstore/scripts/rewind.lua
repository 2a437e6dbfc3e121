-- rewind: end the history at an entry, fenced by the lease; what came after becomes a branch.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] keep, KEYS[4] view, KEYS[5] lease, KEYS[6] anchor,
-- KEYS[7] index, KEYS[8] idem, KEYS[9] idem_old (where this call's reply is recorded),
-- KEYS[10] checkpoints, KEYS[11] checkpoint summaries, KEYS[12] branches,
-- KEYS[13] the new segment's log, KEYS[14] its info (where the abandoned tail goes)
-- ARGV[1] our lease token, ARGV[2] our fence, ARGV[3] now in ms, or '' for the server's clock
-- ARGV[4] this call's id (random, the same on every retry of the call)
-- ARGV[5] idempotency period, ms
-- ARGV[6] the entry the history ends at ('': before the first)
-- ARGV[7] the checkpoint asked for ('' for none): its summary is put back if need be
-- ARGV[8] the session's id (it owns the new segment)
-- ARGV[9] the new segment's id
-- ARGV[10] default TTL in ms, or ''
-- ARGV[11] the most branches the session keeps (the oldest goes)
-- ARGV[12] the chain the caller read (meta 'chain', '' for none)
-- ARGV[13] '1' when the entry is in the chain (older than the live log): then
-- ARGV[14] the history's messages and ARGV[15] its tokens up to the entry,
-- ARGV[16] the new chain (it ends before the bridge), ARGV[17] m, the bridge's entries
--          (the newest of the chain up to the entry, for the new live log), then 9 per
--          entry: id, m, t, c, r, v, vt, n, k (sealed for this session)
--
-- Races it closes: the write is refused unless the lease is still ours, so a
-- holder that paused past its expiry cannot rewind over its successor. In one
-- step, for every pod: the entries after the target leave the live log for a
-- segment that the new branch names (nothing is destroyed: the tail stays
-- readable until the branch goes, its bytes charged to the session's byte quota
-- until then: a rewind gives no room back, an evicted branch does, so what the
-- session holds, branches included, stays within its quota), the counters, the
-- protected copies and the checkpoints follow, the epoch is bumped (a summary job
-- that read the old history is refused at commit, a paged reader stops, warm
-- views go cold) and the anchors and the search index go. The summary in force is
-- kept if it covers no abandoned entry; else a checkpoint's copy that covers only
-- kept entries is put back, or it is dropped. Appends ordered before the rewind
-- belong to the abandoned tail; appends after it extend the new history. A target
-- in the chain is refused unless the caller read the same chain (a fork may have
-- frozen the log since). A retry of a call whose reply was lost is answered with
-- its first reply.
--
-- Returns {'ok', epoch, seq, count, abandoned, branch id ('' if nothing was), evicted
-- segments ('owner:id ...', for the caller to release), 1 if the new segment was made,
-- the chain now and the TTL in ms ('' for none): the caller stretches the chain's segments},
-- {'lease_lost'}, {'absent'},
-- {'missing'} (no such entry in the history) or {'relayout'} (read the chain again).
local prev = recorded(KEYS[8], KEYS[9], ARGV[4])
if prev then
  local out = {'ok'}
  for _, word in ipairs(split(prev, '\31')) do table.insert(out, tonumber(word) or word) end
  return out
end
local now = now_ms(ARGV[3])
if not lease_held(KEYS[5], ARGV[1], ARGV[2], now) then return {'lease_lost'} end
local meta = redis.call('HMGET', KEYS[2], 'seq', 'epoch', 'count', 'tokens', 'last_id', 'chain',
                        'base', 'wm', 'wm_tokens', 'bytes', 'ttl', 'br_n', 'first_id')
if not meta[1] then return {'absent'} end
if (meta[6] or '') ~= ARGV[12] then return {'relayout'} end
local target, base, last = ARGV[6], meta[7] or '', meta[5] or ''
local deep = base ~= '' and not id_before(base, target)
if deep ~= (ARGV[13] == '1') then return {'relayout'} end
if not deep and target ~= '' and #redis.call('XRANGE', KEYS[1], target, target) == 0 then
  return {'missing'}
end
local period = tonumber(ARGV[5])
local epoch, seq = tonumber(meta[2]) or 0, tonumber(meta[1])
local count, tokens, bytes = tonumber(meta[3]) or 0, tonumber(meta[4]) or 0, tonumber(meta[10]) or 0

-- The live log's part after the target goes to the new segment, ids kept.
local low = (deep or target == '') and '-' or '(' .. target
local tail = redis.call('XRANGE', KEYS[1], low, '+')
local gone_count, gone_tokens, moved = 0, 0, 0
for _, row in ipairs(tail) do
  local f = row_fields(row)
  gone_count = gone_count + 1
  gone_tokens = gone_tokens + tonumber(f['t'])
  moved = moved + #f['m'] + #(f['v'] or '')  -- what its append charged: the branch's now
end
if gone_count == 0 and not deep then
  -- Already the end: nothing is abandoned, nothing changes.
  local out = {'ok', epoch, seq, count, 0, '', '', 0, meta[6] or '', ''}
  record(KEYS[8], ARGV[4], table.concat(out, '\31', 2), period)
  redis.call('UNLINK', KEYS[5])
  return out
end
if #tail > 0 then
  copy_rows(KEYS[13], tail)
  for i = 1, #tail, 1000 do
    local ids = {}
    for j = i, math.min(i + 999, #tail) do table.insert(ids, tail[j][1]) end
    redis.call('XDEL', KEYS[1], unpack(ids))
  end
  new_segment(KEYS[14], last, count, tokens, ARGV[8], now)
end
local kept_count, kept_tokens = count - gone_count, tokens - gone_tokens
local chain = meta[6] or ''
local branch_chain = chain
if #tail > 0 then
  branch_chain = (chain == '' and '' or chain .. ' ') .. ARGV[8] .. ':' .. ARGV[9] .. ':' .. last
end
if deep then
  kept_count, kept_tokens = tonumber(ARGV[14]), tonumber(ARGV[15])
  chain = ARGV[16]
  base = string.match(chain, ':([^: ]+)$') or ''
  -- A new stream: its ids start again below the abandoned ones (the bridge's are older).
  -- The bridge copies entries of the chain, charged already (as a freeze's copies are).
  redis.call('UNLINK', KEYS[1])
  add_given(KEYS[1], ARGV, 18, tonumber(ARGV[17]))
end

-- The protected copies of abandoned entries go.
local keep = redis.call('HGETALL', KEYS[3])
local kept_changed = false
for j = 1, #keep, 2 do
  if id_before(target, keep[j]) then
    redis.call('HDEL', KEYS[3], keep[j])
    bytes = bytes - keep_bytes(keep[j + 1])  -- what its pin or append charged: the data
    kept_changed = true
  end
end

-- The summary in force, if it covers nothing abandoned; else a checkpoint's that does not.
epoch = epoch + 1
local wm, wm_tokens = meta[8] or '', tonumber(meta[9]) or 0
local points = redis.call('HGETALL', KEYS[10])
if wm ~= '' and id_before(target, wm) then
  local best, best_id = nil, nil
  for j = 1, #points, 2 do
    local ok, point = pcall(cjson.decode, points[j + 1])
    if ok and type(point) == 'table' and point.branch == '' and point.covers ~= ''
        and not id_before(target, point.covers) then
      if points[j] == ARGV[7] then
        best, best_id = point, points[j]
        break
      end
      if not best or id_before(best.covers, point.covers) then best, best_id = point, points[j] end
    end
  end
  redis.call('UNLINK', KEYS[4])
  if best then
    for _, name in ipairs(SUMMARY_COPY) do
      local value = redis.call('HGET', KEYS[11], best_id .. ':' .. name)
      if value then redis.call('HSET', KEYS[4], name, value) end
    end
    redis.call('HSET', KEYS[4], 'epoch', epoch)
    wm, wm_tokens = best.covers, tonumber(best.wm_tokens) or 0
  else
    wm, wm_tokens = '', 0
  end
elseif redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('HSET', KEYS[4], 'epoch', epoch)
end

-- The branch: the abandoned entries, after the target, in the old chain and the segment,
-- and the bytes of those it moved out of the live log (given back when it goes).
local branch = 'br-' .. ((tonumber(meta[12]) or 0) + 1)
redis.call('HSET', KEYS[12], branch, cjson.encode({
  at = target, ['end'] = last, count = tostring(count - kept_count),
  tokens = tostring(tokens - kept_tokens), chain = branch_chain, made = tostring(now),
  epoch = tostring(epoch - 1), bytes = tostring(moved)}))
for j = 1, #points, 2 do
  local ok, point = pcall(cjson.decode, points[j + 1])
  if ok and type(point) == 'table' and point.branch == '' and id_before(target, point.entry_id) then
    point.branch = branch
    local body = cjson.encode(point)
    bytes = bytes + #body - #points[j + 1]
    redis.call('HSET', KEYS[10], points[j], body)
  end
end
-- The oldest branches go past the most kept, with the checkpoints on them, and give
-- their bytes back.
local evicted = {}
local names = redis.call('HKEYS', KEYS[12])
if #names > tonumber(ARGV[11]) then
  table.sort(names, function(a, b) return tonumber(string.sub(a, 4)) < tonumber(string.sub(b, 4)) end)
  for i = 1, #names - tonumber(ARGV[11]) do
    local ok, old = pcall(cjson.decode, redis.call('HGET', KEYS[12], names[i]))
    if ok and type(old) == 'table' and type(old.chain) == 'string' then
      for owner, id in string.gmatch(old.chain, '([^: ]+):([^: ]+):[^: ]+') do
        table.insert(evicted, owner .. ':' .. id)
      end
      bytes = bytes - (tonumber(old.bytes) or 0)  -- none on a branch made before it was kept
    end
    redis.call('HDEL', KEYS[12], names[i])
    for j = 1, #points, 2 do
      local okp, point = pcall(cjson.decode, points[j + 1])
      if okp and type(point) == 'table' and point.branch == names[i] then
        bytes = bytes - (drop_checkpoint(KEYS[2], KEYS[10], KEYS[11], points[j]) or 0)
      end
    end
  end
end

seq = seq + 1
redis.call('HSET', KEYS[2], 'seq', seq, 'epoch', epoch, 'count', kept_count,
           'tokens', kept_tokens, 'bytes', math.max(0, bytes), 'last_id', target, 'chain', chain,
           'base', base, 'wm', wm, 'wm_tokens', wm_tokens, 'sq', '0', 'br_n',
           (tonumber(meta[12]) or 0) + 1)
if kept_count == 0 then redis.call('HSET', KEYS[2], 'first_id', '') end
redis.call('HDEL', KEYS[2], 'idle')
if kept_changed then redis.call('HINCRBY', KEYS[2], 'kv', 1) end
redis.call('UNLINK', KEYS[6], KEYS[7], KEYS[5])

local ttl = tonumber(meta[11]) or tonumber(ARGV[10])
if ttl and ttl > 0 then
  for _, k in ipairs({1, 2, 3, 4, 10, 11, 12, 13, 14}) do redis.call('PEXPIRE', KEYS[k], ttl) end
end
local out = {'ok', epoch, seq, kept_count, count - kept_count, branch, table.concat(evicted, ' '),
             #tail > 0 and 1 or 0, chain, ttl or ''}
record(KEYS[8], ARGV[4], table.concat(out, '\31', 2), period)
return out
