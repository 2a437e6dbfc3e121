-- view: everything a request view needs, in one round trip.
--
-- KEYS[1] log    stream
-- KEYS[2] meta   hash
-- KEYS[3] keep   hash: entry id -> kind ('s' system/developer, 'p' pinned)
-- KEYS[4] view   hash: the cached summary
-- ARGV[1] budget in stored (cl100k) tokens
-- ARGV[2] entries read per step
--
-- Reads the newest entries first and stops once the budget is full or the
-- summary's watermark is reached, so its cost follows the budget, not the
-- history's length. One script gives one consistent snapshot: a concurrent
-- replace cannot mix two epochs into one view.
--
-- Returns {meta fields, protected entries, kinds, summary fields, tail entries
-- (newest first), reached_start}

local meta = redis.call('HMGET', KEYS[2], 'epoch', 'seq', 'count', 'tokens', 'wm', 'wm_tokens')
local keep = redis.call('HGETALL', KEYS[3])
local kinds = {}
local protected = {}
local used = 0
for i = 1, #keep, 2 do
  local entry = redis.call('XRANGE', KEYS[1], keep[i], keep[i], 'COUNT', 1)[1]
  if entry then
    kinds[keep[i]] = keep[i + 1]
    table.insert(protected, entry)
    local f = entry[2]
    for j = 1, #f, 2 do
      if f[j] == 't' then used = used + tonumber(f[j + 1]) end
    end
  end
end

local summary = redis.call('HMGET', KEYS[4], 'text', 'tokens', 'covers', 'epoch', 'model')
local budget = tonumber(ARGV[1])
local low = '-'
if summary[1] and summary[4] == meta[1] and summary[3] == meta[5] then
  low = '(' .. summary[3]
  if used + tonumber(summary[2]) <= budget then used = used + tonumber(summary[2]) end
else
  summary = {false, false, false, false, false}
end

local chunk = tonumber(ARGV[2])
local tail = {}
local high = '+'
local reached = 0
while true do
  local batch = redis.call('XREVRANGE', KEYS[1], high, low, 'COUNT', chunk)
  local full = false
  for _, entry in ipairs(batch) do
    table.insert(tail, entry)
    if not kinds[entry[1]] then
      local f = entry[2]
      local t, vt = 0, nil
      for j = 1, #f, 2 do
        if f[j] == 't' then t = tonumber(f[j + 1]) elseif f[j] == 'vt' then vt = tonumber(f[j + 1]) end
      end
      used = used + (vt or t)
      if used > budget then full = true break end
    end
  end
  if full then break end
  if #batch < chunk then reached = 1 break end
  high = '(' .. batch[#batch][1]
end

local flat_kinds = {}
for id, kind in pairs(kinds) do
  table.insert(flat_kinds, id)
  table.insert(flat_kinds, kind)
end
return {meta, protected, flat_kinds, summary, tail, reached}
