-- summary_request: raise the session's summary flag, once, and name the job.
--
-- KEYS[1] meta
-- ARGV[1] now in ms, or '' to use the Redis server's clock
-- ARGV[2] '1' to raise it even if it is up (the sweep, for a job that was
--         lost or failed), '0' only if it is down (a view that had to truncate)
--
-- Race it closes: many pods (and the sweep) may find a session that needs a
-- summary at once; the flag is test-and-set here, so only one of them gets a
-- generation to queue, and a generation is never reused (job ids stay unique).
--
-- Returns the generation to queue, or 0 if a job is already flagged.
local now = now_ms(ARGV[1])
if redis.call('HGET', KEYS[1], 'sq') == '1' and ARGV[2] ~= '1' then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- A generation is a time, strictly increasing: job ids are never reused.
local gen = math.max((tonumber(redis.call('HGET', KEYS[1], 'sgen')) or 0) + 1, now)
redis.call('HSET', KEYS[1], 'sq', '1', 'sq_at', now, 'sgen', gen)
return gen
