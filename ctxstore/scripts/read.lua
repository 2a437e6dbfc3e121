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
local out, i, n = {}, 1, 0
while i <= #ARGV do
  local words = tonumber(ARGV[i])
  n = n + 1
  out[n] = redis.call(unpack(ARGV, i + 1, i + words))
  i = i + words + 1
end
return out
