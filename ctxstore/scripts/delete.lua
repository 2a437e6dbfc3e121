-- delete: delete a session, leaving a tombstone that carries its epoch and sequence on.
--
-- KEYS[1..12] the session's keys (log, meta, view, lease, idem, idem_old, keep, anchor,
-- index, checkpoints, checkpoint summaries, branches), KEYS[13] gone
-- ARGV[1] this call's id (random, the same on every retry of the call)
-- ARGV[2] how long the tombstone lasts, ms
-- ARGV[3] now in ms, or '' to use the Redis server's clock
-- ARGV[4] idempotency period, ms: how long this call's reply is kept for a retry
--
-- Races it closes: a session deleted and written again must not start over
-- at epoch 0 and sequence 0 (an append-if or a paged reader of the old
-- history would take the new one for it), nor with a full rate bucket: the
-- tombstone holds the next epoch, a sequence number past the last and the
-- bucket, which the next creating write continues from. The idempotency
-- hashes are kept (they expire on their own): an append retried after the
-- delete is answered as it was applied, never written again into a new
-- life. A retry of a delete whose reply was lost is answered with its
-- recorded reply, whatever happened since (another pod's append that
-- created the session again is not deleted a second time).
--
-- Its segments (its chain's and its branches', lineage.py) are not deleted here: a fork
-- may still read them; they are returned for the caller to release.
--
-- Returns {existed 0/1, the reservation that created the deleted session (or ''), now,
-- the segments it read ('owner:id,...', or '-')}.
local now = now_ms(ARGV[3])
local prev = recorded(KEYS[5], KEYS[6], ARGV[1])
if prev then
  if prev == '0' then return {0, '', now, '-'} end
  local rsv, segments = string.match(prev, '^1 (%S*) ?(%S*)$')
  return {1, rsv or '', now, (segments or '') ~= '' and segments or '-'}
end
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'seq', 'rsv', 'rl_tokens', 'rl_at')
local segments = held_segments(KEYS[2], KEYS[12])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
           KEYS[11], KEYS[12])
local period = tonumber(ARGV[4])
if not meta[2] then  -- nothing, or a lease's fence alone
  record(KEYS[5], ARGV[1], '0', period)
  return {0, '', now, '-'}
end
redis.call('SET', KEYS[13], tombstone(meta[1], meta[2], meta[4], meta[5]),
           'PX', tonumber(ARGV[2]))
local rsv = meta[3] or ''
record(KEYS[5], ARGV[1], '1 ' .. rsv .. ' ' .. segments, period)
return {1, rsv, now, segments}
