-- info: a consistent snapshot of a session's counters.
--
-- KEYS[1] meta, KEYS[2] keep, KEYS[3] view
--
-- Returns {meta as a flat hash, keep as a flat hash, {covers, tokens, epoch}, ttl in ms}
return {
  redis.call('HGETALL', KEYS[1]),
  redis.call('HGETALL', KEYS[2]),
  redis.call('HMGET', KEYS[3], 'covers', 'tokens', 'epoch'),
  redis.call('PTTL', KEYS[1]),
}
