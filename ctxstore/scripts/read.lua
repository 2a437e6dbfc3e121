-- read: one page of the full history, with the epoch it belongs to.
--
-- KEYS[1] log, KEYS[2] meta
-- ARGV[1] exclusive lower bound ('-' for the start, else '(' .. entry id)
-- ARGV[2] page size
--
-- One script, so the epoch answered is the epoch the page was read in: a
-- reader paging through a history that a replace rewrites notices it.
--
-- Returns {epoch, entries}
local epoch = redis.call('HGET', KEYS[2], 'epoch') or '0'
return {epoch, redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))}
