-- segment_hold: record a session as a reader of segments, and make them last as long as it.
--
-- KEYS   pairs: a segment's log, its info hash (all one owner's, so one slot)
-- ARGV[1] the reader, a session id ('': only the TTLs change)
-- ARGV[2] 0 for a session that exists, or the time (ms) by which a fork being made will
--         have been written (its holding lapses after that unless it exists then)
-- ARGV[3] the TTL (ms) the segments must last at least, 0 for ever
--
-- Race it closes: a segment is deleted only when every reader recorded on it is
-- found gone (segment_release.lua compares what it removes), so a reader is
-- recorded here, on a segment that still exists, before it is written: a
-- release running meanwhile keeps the segment. A reader recorded as existing is
-- never downgraded to pending. TTLs only grow, to the longest-lived reader's.
--
-- Returns {'ok'}, or {'missing', i} when the i-th segment is gone (nothing changed). With
-- no reader (TTLs only) a gone segment is skipped, the others stretched: nobody is
-- recorded on it, and a branch's segment may have lasted only its rewind's TTL.
local reader = ARGV[1]
local found = {}
for i = 1, #KEYS, 2 do
  found[i] = redis.call('EXISTS', KEYS[i + 1]) == 1
  if not found[i] and reader ~= '' then return {'missing', (i + 1) / 2} end
end
for i = 1, #KEYS, 2 do
  if found[i] then
    if reader ~= '' then
      local field = 'h:' .. reader
      local held = redis.call('HGET', KEYS[i + 1], field)
      if held ~= '0' and (ARGV[2] == '0' or not held or tonumber(held) < tonumber(ARGV[2])) then
        redis.call('HSET', KEYS[i + 1], field, ARGV[2])
      end
    end
    outlive(tonumber(ARGV[3]), KEYS[i], KEYS[i + 1])
  end
end
return {'ok'}
