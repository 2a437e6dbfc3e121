-- checkpoint: record where a session is now, and the summary in force, in one step.
--
-- KEYS[1] meta, KEYS[2] view (the cached summary), KEYS[3] checkpoints (hash: id ->
-- record), KEYS[4] checkpoint summaries (hash: '<id>:<field>' -> the summary's value),
-- KEYS[5] idem, KEYS[6] idem_old (where this call's reply is recorded)
-- ARGV[1] this call's id (random, the same on every retry of the call)
-- ARGV[2] the checkpoint's name ('' for none)
-- ARGV[3] quota: the most checkpoints the session may keep (0: none)
-- ARGV[4] quota: the most bytes in the session (0: none)
-- ARGV[5] quota: appends per second (0: none): a checkpoint counts as one write
-- ARGV[6] quota: the burst that rate allows
-- ARGV[7] idempotency period, ms: how long this call's reply is kept for a retry
-- ARGV[8] now in ms, or '' to use the Redis server's clock
--
-- Race it closes: the position (last entry, sequence number, epoch, counters)
-- and the summary are read and recorded in one step, so a checkpoint never
-- pairs one history's position with another's summary, whatever appends,
-- summaries or rewrites run beside it. It costs the same at any history's
-- length: nothing of the stream is read. The summary's values are copied
-- as stored (sealed for this session), and count against the byte quota.
-- A retry of a call whose reply was lost is answered with the checkpoint it
-- made, never makes a second one.
--
-- Returns {'ok', id, record (JSON)}, {'absent'} (no session) or
-- {'quota', name, limit, value}.
local prev = recorded(KEYS[5], KEYS[6], ARGV[1])
if prev then
  local id, body = string.match(prev, '^(%S+) (.*)$')
  return {'ok', id, body}
end
local meta = redis.call('HMGET', KEYS[1], 'seq', 'epoch', 'count', 'tokens', 'last_id', 'wm',
                        'wm_tokens', 'bytes', 'cp_n')
if not meta[1] then return {'absent'} end
local limit = tonumber(ARGV[3])
local held = redis.call('HLEN', KEYS[3])
if limit > 0 and held >= limit then
  return {'quota', 'checkpoints', tostring(limit), tostring(held + 1)}
end
local epoch = meta[2] or '0'
local summary = redis.call('HMGET', KEYS[2], unpack(SUMMARY_COPY))
local covers = ''
if summary[1] and summary[5] and summary[5] ~= '' and summary[5] == meta[6]
    and summary[6] == epoch then
  covers = summary[5]
end
local now = now_ms(ARGV[8])
local id = 'cp-' .. ((tonumber(meta[9]) or 0) + 1)
local body = cjson.encode({
  entry_id = meta[5] or '', seq = meta[1], epoch = epoch, count = meta[3] or '0',
  tokens = meta[4] or '0', covers = covers, wm_tokens = covers ~= '' and (meta[7] or '0') or '0',
  made = tostring(now), name = ARGV[2], branch = ''})
local size = #body
local fields = {}
if covers ~= '' then
  for i, name in ipairs(SUMMARY_COPY) do
    if summary[i] and summary[i] ~= '' then
      table.insert(fields, id .. ':' .. name)
      table.insert(fields, summary[i])
      size = size + #summary[i]
    end
  end
end
local refusal = size_refusal((tonumber(meta[8]) or 0) + size, 0, tonumber(ARGV[4]), 0)
if not refusal then refusal = take_rate(KEYS[1], 1, tonumber(ARGV[5]), tonumber(ARGV[6])) end
if refusal then return refusal end

redis.call('HSET', KEYS[3], id, body)
if #fields > 0 then redis.call('HSET', KEYS[4], unpack(fields)) end
redis.call('HSET', KEYS[1], 'cp_n', (tonumber(meta[9]) or 0) + 1)
redis.call('HINCRBY', KEYS[1], 'bytes', size)
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[3], ttl)
  if #fields > 0 then redis.call('PEXPIRE', KEYS[4], ttl) end
end
record(KEYS[5], ARGV[1], id .. ' ' .. body, tonumber(ARGV[7]))
return {'ok', id, body}
