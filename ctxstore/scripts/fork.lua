-- fork: write a new session whose history is another's up to an entry, in one step.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] keep, KEYS[4] view, KEYS[5] gone, KEYS[6] idem,
-- KEYS[7] idem_old (where this call's reply is recorded)
-- ARGV[1] this call's id (random, the same on every retry of the call)
-- ARGV[2] the index reservation this write may create the session under ('' for none)
-- ARGV[3] that reservation's deadline, ms
-- ARGV[4] the time (ms) the segments it reads are kept for it until (segment_hold.lua)
-- ARGV[5] now in ms, or '' to use the Redis server's clock
-- ARGV[6] default TTL in ms, or ''
-- ARGV[7] idempotency period, ms
-- ARGV[8] quota: the most bytes in the session (0: none)
-- ARGV[9] quota: the most tokens in the session (0: none)
-- ARGV[10] quota: appends per second (0: none): a fork counts as one write
-- ARGV[11] quota: the burst that rate allows
-- ARGV[12] messages in the history, ARGV[13] their tokens
-- ARGV[14] the first entry's id, ARGV[15] the last one's (the fork point)
-- ARGV[16] the chain (lineage.py; '' for none), ARGV[17] its last entry ('' for none)
-- ARGV[18] the source and the fork point ('session entry')
-- ARGV[19] the summary's watermark ('' for none), ARGV[20] the tokens it covers
-- ARGV[21] the bytes of the shared segments up to the fork point (charged, not copied)
-- ARGV[22] s, then s pairs: the summary's fields (view hash), sealed for this session
-- then p, then p pairs: a protected entry's id and its keep copy
-- then m, then 9 per entry of the live log: id, m, t, c, r, v, vt, n, k
--
-- Races it closes: the session is created only if it does not exist (a fork
-- never writes over a session, not even one written meanwhile), only under a
-- live reservation of the tenant's index (listed and counted first), and only
-- while the segments it reads are still kept for it (they could be released
-- after that); a session deleted before continues its epoch and sequence. The
-- live log, the copies, the summary and the counters appear together: a pod
-- never sees half a fork. A retry of a call whose reply was lost is answered
-- with its first reply, even if the session was written since.
--
-- Returns {'ok', epoch, seq}, {'exists', fresh 0, now}, {'expired', fresh, now},
-- {'quota', name, limit, value, fresh, now} or {'reserve'}.
local prev = recorded(KEYS[6], KEYS[7], ARGV[1])
if prev then
  local epoch, seq = string.match(prev, '^(%d+) (%d+)$')
  return {'ok', tonumber(epoch), tonumber(seq)}
end
local now = now_ms(ARGV[5])
if redis.call('HEXISTS', KEYS[2], 'seq') == 1 then return {'exists', 0, now} end
local refusal, epoch, seq, bucket = creation(KEYS[5], ARGV[2], ARGV[3], now)
if refusal then return refusal end
if now > tonumber(ARGV[4]) - 1000 then return {'expired', 1, now} end

local summary, at = given_pairs(ARGV, 22)
local kept, after_kept = given_pairs(ARGV, at)
local bytes = tonumber(ARGV[21])
for i = 2, #kept, 2 do bytes = bytes + #kept[i] end
local m = tonumber(ARGV[after_kept])
for i = 0, m - 1 do
  local a = after_kept + 1 + i * 9
  bytes = bytes + #ARGV[a + 1] + #ARGV[a + 5]
end
local tokens = tonumber(ARGV[13])
refusal = size_refusal(bytes, tokens, tonumber(ARGV[8]), tonumber(ARGV[9]))
if not refusal then
  refusal = take_rate(KEYS[2], 1, tonumber(ARGV[10]), tonumber(ARGV[11]), bucket)
end
if refusal then
  table.insert(refusal, 1)
  table.insert(refusal, now)
  return refusal
end
created(KEYS[2], KEYS[5], ARGV[2])

add_given(KEYS[1], ARGV, after_kept + 1, m)
if #kept > 0 then redis.call('HSET', KEYS[3], unpack(kept)) end
if #summary > 0 then
  redis.call('HSET', KEYS[4], unpack(summary))
  redis.call('HSET', KEYS[4], 'epoch', epoch)
end
seq = seq + 1
redis.call('HSET', KEYS[2], 'seq', seq, 'epoch', epoch, 'count', ARGV[12], 'tokens', tokens,
           'bytes', bytes, 'first_id', ARGV[14], 'last_id', ARGV[15], 'chain', ARGV[16],
           'base', ARGV[17], 'origin', ARGV[18], 'wm', ARGV[19], 'wm_tokens', ARGV[20], 'sq', '0')
if #kept > 0 then redis.call('HINCRBY', KEYS[2], 'kv', 1) end

local ttl = tonumber(ARGV[6])
if ttl and ttl > 0 then
  for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ttl) end
end
record(KEYS[6], ARGV[1], epoch .. ' ' .. seq, tonumber(ARGV[7]))
return {'ok', epoch, seq}
