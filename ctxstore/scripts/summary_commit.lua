-- summary_commit: record a summary job's outcome; on success, swap the summary in.
--
-- KEYS[1] meta   hash: epoch, tokens, watermark (wm, wm_tokens), summary flags
-- KEYS[2] view   hash: the cached summary {l1, n1, l2, n2, covers, epoch, model, at, state}:
--                the facts ledger (level 1) and the narrative that level 2 adds to it,
--                each level's tokens as the view sends it, what it covers, and the
--                summarizer's own state for the next fold
-- KEYS[3] lease  hash: the lease holder's token, fence and expiry
-- ARGV[1] mode: 'committed', 'idle' (nothing to summarize) or 'failed'
-- ARGV[2] our lease token
-- ARGV[3] our fence
-- ARGV[4] now in ms, or '' to use the Redis server's clock
-- ARGV[5] the epoch and the life (meta's rsv) the job read, as 'epoch rsv'
-- ARGV[6] the watermark the job read ('' for none)
-- ARGV[7] summary threshold (tokens past the watermark that make the next summary due)
-- ARGV[8] the job's duration in ms
-- committed: ARGV[9] new watermark, ARGV[10] its wm_tokens, ARGV[11] the ledger,
--         ARGV[12] level 1's tokens, ARGV[13] model, ARGV[14] the narrative ('' for none),
--         ARGV[15] level 2's tokens, ARGV[16] the summarizer's state ('' for none)
-- failed: ARGV[9] the error, one line
--
-- Races it closes: a summary is swapped in only if the lease is still ours
-- (token, fence, not expired), the epoch is the one the job read (no replace
-- or clear came between) and the watermark is the one it read (no other
-- commit advanced it), so there is exactly one commit per coverage point and
-- a stale summary never replaces the history it did not read. The raw stream
-- is never touched. Appends that came during the job stay past the new
-- watermark; if they make another summary due, the flag stays up and the
-- next generation is returned for the caller to queue. A retry of a commit
-- that was applied before its reply was lost (the watermark is already the
-- one it sets, under the same lease) is answered again, not called stale. A
-- job that found nothing to cover lowers the flag and marks the session
-- idle: the next append that may make a cut possible (one that carries a
-- tool result, or enough new tokens) raises it again.
--
-- Returns {'ok', next generation or 0}, {'lease_lost'}, or {'stale', why}
local mode = ARGV[1]
local now = now_ms(ARGV[4])
if not lease_held(KEYS[3], ARGV[2], ARGV[3], now) then return {'lease_lost'} end
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'wm', 'tokens', 'wm_tokens', 'sq', 'sgen',
                        'rsv')
-- The session expired and was written again while the job ran: another life, whose
-- epoch and watermark may equal those the job read.
if (meta[1] or '0') .. ' ' .. (meta[7] or '') ~= ARGV[5] then return {'stale', 'epoch'} end
if mode == 'committed' and meta[2] == ARGV[9] and ARGV[9] ~= ARGV[6] then
  -- Only this lease's holder commits, and a watermark only moves forward.
  if meta[5] == '1' then return {'ok', tonumber(meta[6]) or 0} end
  return {'ok', 0}
end
if (meta[2] or '') ~= ARGV[6] then return {'stale', 'watermark'} end

local wm_tokens = tonumber(meta[4]) or 0
redis.call('HSET', KEYS[1], 'sum_at', now, 'sum_ms', ARGV[8], 'sum_outcome', mode)
if mode == 'committed' then
  redis.call('UNLINK', KEYS[2])
  redis.call('HSET', KEYS[2], 'l1', ARGV[11], 'n1', ARGV[12], 'l2', ARGV[14], 'n2', ARGV[15],
             'covers', ARGV[9], 'epoch', meta[1] or '0', 'model', ARGV[13], 'at', now, 'state', ARGV[16])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
  wm_tokens = tonumber(ARGV[10])
  redis.call('HSET', KEYS[1], 'wm', ARGV[9], 'wm_tokens', wm_tokens, 'sum_err', '')
  redis.call('HDEL', KEYS[1], 'idle')
  redis.call('HINCRBY', KEYS[1], 'sum_runs', 1)
elseif mode == 'failed' then
  redis.call('HSET', KEYS[1], 'sum_err', ARGV[9], 'sum_fail_at', now)
  redis.call('HINCRBY', KEYS[1], 'sum_failures', 1)
  -- The flag stays up: the sweep queues the session again after a pause,
  -- instead of every append retrying a summarizer that keeps failing.
  return {'ok', 0}
else
  -- Nothing could be covered (a tool exchange still open): no job until something changes.
  redis.call('HSET', KEYS[1], 'sq', '0', 'idle', tonumber(meta[3]) or 0)
  return {'ok', 0}
end

local threshold = tonumber(ARGV[7])
if threshold > 0 and (tonumber(meta[3]) or 0) - wm_tokens >= threshold then
  return {'ok', next_generation(KEYS[1], now)}
end
redis.call('HSET', KEYS[1], 'sq', '0')
return {'ok', 0}
