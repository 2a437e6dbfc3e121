-- freeze: make a session's live log a segment a fork can share, and start a new one.
--
-- KEYS[1] log, KEYS[2] meta, KEYS[3] the new segment's log, KEYS[4] its info
-- ARGV[1] the epoch and ARGV[2] the life (meta 'rsv') the caller read
-- ARGV[3] the chain it read ('' for none)
-- ARGV[4] the entry the new live log starts after (its newest part is copied back)
-- ARGV[5] the entry the fork is at (it must still be in the live log)
-- ARGV[6] the session's id (it owns the segment)
-- ARGV[7] the fork being made (a session id): it is recorded as a reader
-- ARGV[8] the time (ms) by which it will have been written
-- ARGV[9] its TTL in ms (0: none): the segment lasts at least as long
-- ARGV[10] now in ms, or '' to use the Redis server's clock
-- ARGV[11] the new segment's id
--
-- Races it closes: the log is renamed (O(1)) so its entries never change again,
-- and its newest part is copied back, ids kept, in the same step: every pod
-- reads the same history before and after, appends go on in the new live log,
-- and nothing a fork shares can be popped, rewound or deleted under it. The
-- fork is recorded as a reader before it exists, so a release of the segment
-- running meanwhile keeps it. Refused when the history changed since the
-- caller read it (a rewrite, a pop of the fork point, another freeze): it
-- reads again. The segment's TTL is the log's, stretched to the fork's.
--
-- Returns {'ok', the segment's last entry} or {'relayout'}.
local meta = redis.call('HMGET', KEYS[2], 'seq', 'epoch', 'rsv', 'chain', 'last_id', 'count',
                        'tokens')
if not meta[1] or (meta[2] or '0') ~= ARGV[1] or (meta[3] or '') ~= ARGV[2]
    or (meta[4] or '') ~= ARGV[3] then
  return {'relayout'}
end
if #redis.call('XRANGE', KEYS[1], ARGV[5], ARGV[5]) == 0 then return {'relayout'} end
local now = now_ms(ARGV[10])
redis.call('RENAME', KEYS[1], KEYS[3])
copy_rows(KEYS[1], redis.call('XRANGE', KEYS[3], '(' .. ARGV[4], '+'))
new_segment(KEYS[4], meta[5], meta[6], meta[7], ARGV[6], now)
redis.call('HSET', KEYS[4], 'h:' .. ARGV[7], ARGV[8])
local ttl = redis.call('PTTL', KEYS[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[4], ttl)
end
outlive(tonumber(ARGV[9]), KEYS[3], KEYS[4])
local chain = (meta[4] and meta[4] ~= '' and meta[4] .. ' ' or '') .. ARGV[6] .. ':' .. ARGV[11]
              .. ':' .. ARGV[4]
redis.call('HSET', KEYS[2], 'chain', chain, 'base', ARGV[4])
return {'ok', meta[5]}
