-- lease_renew: extend our lease, only if it is still ours.
--
-- KEYS[1] lease
-- KEYS[2] meta (a session never written: its meta, the fence alone, lasts as the lease)
-- ARGV[1] our token, ARGV[2] our fence, ARGV[3] time to live (ms),
-- ARGV[4] now in ms, or '' to use the Redis server's clock
--
-- Race it closes: a holder whose lease expired and was taken must not
-- extend the new holder's lease: compare token and fence, then extend.
--
-- Returns {1, expires} or {0}
local now = now_ms(ARGV[4])
if not lease_held(KEYS[1], ARGV[1], ARGV[2], now) then return {0} end
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expires', now + ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
if redis.call('HEXISTS', KEYS[2], 'seq') == 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return {1, now + ttl}
