-- search_index: add one batch of entries to a session's search index, or start it over.
--
-- KEYS[1] index (hash: '@' -> the header, and one field per term -> its postings)
-- KEYS[2] meta
-- ARGV[1] the epoch the batch was read in
-- ARGV[2] the life (meta 'rsv') it was read in
-- ARGV[3] the id of the key terms are hashed with ('-': terms in clear)
-- ARGV[4] the cursor the batch follows ('' : a new index, from the first entry)
-- ARGV[5] the last entry id of the batch (the new cursor)
-- ARGV[6] entries in the batch, ARGV[7] their terms in all
-- then pairs: term field, postings to add ("id,tf,length;" per entry)
--
-- The header is "epoch life key cursor docs length". Races it closes: two
-- searchers (or a searcher and a worker) that read the same batch add it
-- once, as the batch must follow the cursor the index is at; a batch read
-- before a replace, clear, pop or delete-and-recreate is refused (the epoch
-- or life moved), so an index never mixes two histories. The index expires
-- with the session's meta.
--
-- Returns {'ok'}, {'moved'} (read the header again) or {'gone'} (no session).
local meta = redis.call('HMGET', KEYS[2], 'epoch', 'rsv', 'seq')
if not meta[3] then return {'gone'} end
if (meta[1] or '0') ~= ARGV[1] or (meta[2] or '') ~= ARGV[2] then return {'moved'} end
local head = redis.call('HGET', KEYS[1], '@')
local docs, length = 0, 0
local same = false
if head then
  local e, l, k, c, d, n = string.match(head, '^(%S+) (%S+) (%S+) (%S*) (%d+) (%d+)$')
  if e == ARGV[1] and l == (ARGV[2] == '' and '-' or ARGV[2]) and k == ARGV[3] then
    same = true
    if c ~= ARGV[4] then return {'moved'} end
    docs, length = tonumber(d), tonumber(n)
  end
end
if not same then
  if ARGV[4] ~= '' then return {'moved'} end
  -- A write that adds memory first: a full Redis refuses it, as it refuses by EVALSHA only
  -- a script's first write (after a DEL, it would take a whole new index past maxmemory).
  redis.call('HSET', KEYS[1], '@', '')
  redis.call('UNLINK', KEYS[1])
end
for i = 8, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old then
    redis.call('HSET', KEYS[1], ARGV[i], old .. ARGV[i + 1])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[1], '@', table.concat({
  ARGV[1], ARGV[2] == '' and '-' or ARGV[2], ARGV[3], ARGV[5],
  tostring(docs + tonumber(ARGV[6])), tostring(length + tonumber(ARGV[7]))}, ' '))
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
return {'ok'}
