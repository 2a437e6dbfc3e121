-- segment_release: forget a segment's readers that are gone; delete it when none is left.
--
-- KEYS[1] the segment's log, KEYS[2] its info hash
-- ARGV[1] '1': delete the segment if no reader is left; '0': only forget those below
-- then pairs: a reader found gone, and the value its field held when it was read
--
-- Race it closes: a reader recorded after the caller looked (a fork being made,
-- segment_hold.lua), or one recorded again since (its value changed), is kept,
-- and the segment with it: only readers the caller saw gone are removed, and
-- the segment goes only when no other is left.
--
-- Returns 1 if the segment is gone, else 0.
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], 'h:' .. ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[2], 'h:' .. ARGV[i])
  end
end
if ARGV[1] ~= '1' then return 0 end
for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
  if string.sub(field, 1, 2) == 'h:' then return 0 end
end
redis.call('UNLINK', KEYS[1], KEYS[2])
return 1
