-- lease_release: give the lease back, only if it is ours.
--
-- KEYS[1] lease
-- KEYS[2] meta
-- ARGV[1] our token
--
-- Races it closes: a holder whose lease expired must not delete the next
-- holder's lease (the bug of locks released without checking the owner).
-- A lease taken on a session that was never written leaves a meta holding
-- only the fencing counter; it goes with the lease, so a refused or
-- abandoned write leaves nothing behind (a later holder's token still
-- differs from any earlier one, so restarting the fence is safe). On a
-- written session the last released token is kept in meta: a retry of a
-- release whose reply was lost finds it and answers that it was ours (on a
-- session never written, where nothing is kept, it answers 0).
--
-- Returns 1 if ours was released, 0 if it was no longer ours.
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('UNLINK', KEYS[1])
  if redis.call('HEXISTS', KEYS[2], 'seq') == 0 then
    redis.call('UNLINK', KEYS[2])
  else
    redis.call('HSET', KEYS[2], 'released', ARGV[1])
  end
  return 1
end
if redis.call('HGET', KEYS[2], 'released') == ARGV[1] then return 1 end
return 0
