-- lease_release: give the lease back, only if it is ours.
--
-- KEYS[1] lease
-- ARGV[1] our token
--
-- Race it closes: a holder whose lease expired must not delete the next
-- holder's lease (the bug of locks released without checking the owner).
--
-- Returns 1 if ours was released, 0 if it was no longer ours.
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
