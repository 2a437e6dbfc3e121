-- import_stage: add a batch of an import's entries to its staging keys.
--
-- KEYS[1] the staging log, KEYS[2] the staging keep hash (both in the session's slot:
--         import_commit.lua renames them into place)
-- ARGV[1] how long the staging keys last, ms (an import that dies leaves nothing)
-- then 10 per entry: id, kind ('s', 'p' or ''), m, t, c, r, v, vt, n, k
--
-- Race it closes: none to the session itself (nothing of it is written until the
-- commit). Entries keep the ids they were exported with, in order (the caller
-- checks), so an entry at or before the last one staged was staged by this very
-- batch: a batch sent again (its reply was lost) adds nothing twice and is
-- answered as the first time.
--
-- Returns the bytes the batch adds (the session's byte quota counts them).
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local staged = #top > 0 and top[1][1] or ''
local bytes = 0
for i = 2, #ARGV, 10 do
  if not id_before(ARGV[i], staged) and ARGV[i] ~= staged then
    redis.call('XADD', KEYS[1], ARGV[i], unpack(entry_fields(ARGV[i + 2], ARGV[i + 3],
               ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9])))
    if ARGV[i + 1] ~= '' then
      redis.call('HSET', KEYS[2], ARGV[i],
                 keep_value(ARGV[i + 1], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 2]))
    end
  end
  bytes = bytes + #ARGV[i + 2] + #ARGV[i + 6]
  if ARGV[i + 1] ~= '' then bytes = bytes + #ARGV[i + 2] end
end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, tonumber(ARGV[1])) end
return bytes
