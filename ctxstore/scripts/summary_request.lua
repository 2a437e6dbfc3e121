-- summary_request: raise the session's summary flag, once, and name the job.
--
-- KEYS[1] meta
-- KEYS[2] idem, KEYS[3] idem_old (where this call's reply is recorded)
-- ARGV[1] now in ms, or '' to use the Redis server's clock
-- ARGV[2] '1' to raise it even if it is up (the sweep, for a job that was
--         lost or failed), '0' only if it is down (a view that had to truncate)
-- ARGV[3] this call's id (random, the same on every retry of the call)
-- ARGV[4] idempotency period, ms: how long this call's reply is kept for a retry
--
-- Race it closes: many pods (and the sweep) may find a session that needs a
-- summary at once; the flag is test-and-set here, so only one of them gets a
-- generation to queue, and a generation is never reused (job ids stay unique).
-- A retry of a call that raised the flag, whose reply was lost, is answered
-- with the generation it raised (not 0, which would leave it to the sweep,
-- nor a new one, which would queue a second job), whatever came between.
--
-- Returns the generation to queue, or 0 if a job is already flagged (or there
-- is no session).
local prev = recorded(KEYS[2], KEYS[3], ARGV[3])
if prev then return tonumber(prev) end
local now = now_ms(ARGV[1])
local meta = redis.call('HMGET', KEYS[1], 'seq', 'sq')
if not meta[1] then return 0 end
if meta[2] == '1' and ARGV[2] ~= '1' then return 0 end
local gen = next_generation(KEYS[1], now)
record(KEYS[2], ARGV[3], gen, tonumber(ARGV[4]))
return gen
