-- read: commands that only read, run together, for a Redis past its maxmemory.
--
-- Reads go by MULTI/EXEC, an atomic snapshot that costs less than a script; but a
-- Redis that is full (maxmemory, policy noeviction) refuses every command queued in
-- MULTI, reads too, where it runs a script that only reads: by EVALSHA, as any
-- script until a command that would add memory; by FCALL, as this function is
-- registered 'no-writes' (Connection.transaction sends this after such a refusal).
-- Atomic too: the same snapshot, with every reply copied through Lua.
--
-- KEYS    every key the commands read (one slot)
-- ARGV    per command: the number of its words, then its words (the command's name first)
--
-- Returns each command's reply, in order (a missing value as nil). A refused command
-- (a write among them, or a key of the wrong type) fails the whole script.

-- Lua passes at most ~8,000 values to a function (its C stack): a longer command of the
-- variadic reads the store sends (Connection's _READS) goes in parts of at most CHUNK words
-- after its first `head` (the name, and the key it reads), their replies joined (one per
-- word) or, for EXISTS, added.
local CHUNK = 4000
local SPLIT = {hmget = 2, zmscore = 2, mget = 1, exists = 1}

local function call(first, last)
  local name = string.lower(ARGV[first])
  local head = SPLIT[name]
  if last - first < CHUNK or not head then return redis.call(unpack(ARGV, first, last)) end
  local replies, total, words = {}, 0, {}
  for w = 1, head do words[w] = ARGV[first + w - 1] end
  local at = first + head
  while at <= last do
    local stop = math.min(at + CHUNK - 1, last)
    for w = at, stop do words[head + w - at + 1] = ARGV[w] end
    local part = redis.call(unpack(words, 1, head + stop - at + 1))
    if name == 'exists' then
      total = total + part
    else
      for r = 1, stop - at + 1 do replies[#replies + 1] = part[r] end
    end
    at = stop + 1
  end
  if name == 'exists' then return total end
  return replies
end

local out, i, n = {}, 1, 0
while i <= #ARGV do
  local words = tonumber(ARGV[i])
  n = n + 1
  out[n] = call(i + 1, i + words)
  i = i + words + 1
end
return out
