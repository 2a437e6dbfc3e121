-- append: add messages to a session, in one step, without a lock.
--
-- KEYS[1] log    stream, one entry per message
-- KEYS[2] meta   hash: epoch, seq, count, tokens, first/last id, watermark...
-- KEYS[3] idem   hash: idempotency key -> "entry-id seq epoch" (current generation)
-- KEYS[4] idem_old  the previous generation of idem
-- KEYS[5] keep   hash: entry id -> header and copy of each message every view sends
-- KEYS[6] view   the cached summary (only its TTL is touched here)
-- ARGV[1] expected seq, or '' to append unconditionally
-- ARGV[2] default TTL in ms, or '' (a TTL set on the session wins)
-- ARGV[3] idempotency window: keys per generation, at most
-- ARGV[4] summary threshold: tokens past the watermark that make a summary due (0: never)
-- ARGV[5] n, the number of messages
-- ARGV[6] idempotency period (ms): a generation also ends after this long, and
--         each generation expires one period after it ends
-- ARGV[7] quota: the most bytes in the session (0: none)
-- ARGV[8] quota: the most tokens in the session (0: none)
-- ARGV[9] quota: appends per second for the session (0: none)
-- ARGV[10] quota: the burst that rate allows
-- then 8 per message:
--         data, tokens, idempotency key, kind ('s', 'p' or ''), call ids, result ids
--         (joined by \x1f), preview ('' or JSON), preview tokens
--
-- Races it closes: a retry of an append that Redis applied before the
-- connection broke is answered with the original entry (the idempotency
-- key), not written twice; an append-if whose expected seq is stale is
-- refused before anything is written; a quota that would be exceeded is
-- refused before anything is written (a retry of an applied append is still
-- answered, quota or not); counters and stream change together, so meta
-- always matches the stream. Redis orders concurrent appends: no lock.
--
-- Returns {'ok', due_generation, (entry id, seq, epoch, duplicate 0/1) per message},
--      {'conflict', current seq} or {'quota', name, limit, value}.

local PER = 8
local FIRST = 10  -- ARGV index before the first message's arguments
local meta = redis.call('HMGET', KEYS[2], 'seq', 'epoch', 'count', 'tokens', 'ttl', 'idem_n',
                        'wm_tokens', 'sq', 'first_id', 'idem_rot', 'idem_since', 'bytes',
                        'rl_tokens', 'rl_at')
local seq = tonumber(meta[1]) or 0
local epoch = tonumber(meta[2]) or 0
local count = tonumber(meta[3]) or 0
local tokens = tonumber(meta[4]) or 0
local idem_n = tonumber(meta[6]) or 0
local n = tonumber(ARGV[5])

local seen = {}
local fresh = 0
for i = 1, n do
  local key = ARGV[FIRST + (i - 1) * PER + 3]
  local prev = redis.call('HGET', KEYS[3], key)
  if not prev and meta[10] then prev = redis.call('HGET', KEYS[4], key) end
  seen[i] = prev
  if not prev then fresh = fresh + 1 end
end

if fresh > 0 and ARGV[1] ~= '' and tonumber(ARGV[1]) ~= seq then
  return {'conflict', seq}
end

local bytes = tonumber(meta[12]) or 0
local rate_tokens, rate_at = nil, nil
if fresh > 0 then
  local new_bytes, new_tokens = 0, 0
  for i = 1, n do
    if not seen[i] then
      local base = FIRST + (i - 1) * PER
      new_bytes = new_bytes + #ARGV[base + 1]
      new_tokens = new_tokens + tonumber(ARGV[base + 2])
    end
  end
  local refusal = size_refusal(bytes + new_bytes, tokens + new_tokens,
                               tonumber(ARGV[7]), tonumber(ARGV[8]))
  if refusal then return refusal end
  local rate = tonumber(ARGV[9])
  if rate > 0 then
    -- A token bucket in the session's meta: refilled at `rate` per second up to `burst`.
    local burst = tonumber(ARGV[10])
    rate_at = now_ms('')
    local last = tonumber(meta[14]) or rate_at
    rate_tokens = math.min(burst, (tonumber(meta[13]) or burst) + (rate_at - last) * rate / 1000)
    if rate_tokens < fresh then
      -- Strings: Redis would truncate a fractional Lua number to an integer.
      return {'quota', 'appends_per_second', tostring(rate), tostring(fresh - rate_tokens)}
    end
    rate_tokens = rate_tokens - fresh
  end
  bytes = bytes + new_bytes
end

local window = tonumber(ARGV[3])
local period = tonumber(ARGV[6])
local since = tonumber(meta[11]) or 0
local rotated, since_changed = false, false
local out = {'ok', 0}
local first_id = meta[9]
local last_id = nil
for i = 1, n do
  local base = FIRST + (i - 1) * PER
  if seen[i] then
    local id, s, e = string.match(seen[i], '^(%S+) (%d+) (%d+)$')
    table.insert(out, id)
    table.insert(out, tonumber(s))
    table.insert(out, tonumber(e))
    table.insert(out, 1)
  else
    local t = tonumber(ARGV[base + 2])
    local id = add_entry(KEYS[1], KEYS[5], ARGV[base + 1], t, ARGV[base + 4], ARGV[base + 5],
                         ARGV[base + 6], ARGV[base + 7], ARGV[base + 8])
    seq = seq + 1
    count = count + 1
    tokens = tokens + t
    if not first_id or first_id == '' then first_id = id end
    last_id = id
    local now = tonumber(string.match(id, '^(%d+)'))
    if idem_n >= window or now - since >= period then
      -- Rotate in O(1): keys are remembered for at least one period (or one
      -- window of appends), and at most two.
      if idem_n > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
        redis.call('RENAME', KEYS[3], KEYS[4])
        redis.call('PEXPIRE', KEYS[4], period)
        rotated = true
      end
      idem_n = 0
      since = now
      since_changed = true
    end
    redis.call('HSET', KEYS[3], ARGV[base + 3], id .. ' ' .. seq .. ' ' .. epoch)
    idem_n = idem_n + 1
    table.insert(out, id)
    table.insert(out, seq)
    table.insert(out, epoch)
    table.insert(out, 0)
  end
end

if fresh == 0 then return out end

redis.call('HSET', KEYS[2], 'seq', seq, 'epoch', epoch, 'count', count, 'tokens', tokens,
           'bytes', bytes, 'idem_n', idem_n, 'first_id', first_id, 'last_id', last_id)
if rate_at then redis.call('HSET', KEYS[2], 'rl_tokens', rate_tokens, 'rl_at', rate_at) end
if rotated then redis.call('HSET', KEYS[2], 'idem_rot', '1') end
if since_changed then redis.call('HSET', KEYS[2], 'idem_since', since) end
-- The current generation goes too when the session falls quiet.
redis.call('PEXPIRE', KEYS[3], 2 * period)

local threshold = tonumber(ARGV[4])
if threshold > 0 and meta[8] ~= '1' and tokens - (tonumber(meta[7]) or 0) >= threshold then
  -- Generations are times (made strictly increasing), so a job id is never
  -- reused, not even by a session deleted and written again (arq refuses ids
  -- it still keeps a result for).
  local now = tonumber(string.match(last_id, '^(%d+)'))
  local gen = math.max((tonumber(redis.call('HGET', KEYS[2], 'sgen')) or 0) + 1, now)
  redis.call('HSET', KEYS[2], 'sq', '1', 'sq_at', now, 'sgen', gen)
  out[2] = gen
end

local ttl = tonumber(meta[5]) or tonumber(ARGV[2])
if ttl and ttl > 0 then
  for _, k in ipairs({1, 2, 5, 6}) do redis.call('PEXPIRE', KEYS[k], ttl) end
end
return out
