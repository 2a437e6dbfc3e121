-- _lib: functions the scripts share. Script.load puts this file in front of
-- every script, so each one is still sent (and cached) as a single source.

-- The fields of the cached summary (the view hash) a checkpoint copies, as
-- '<checkpoint id>:<field>' in the session's checkpoint summaries.
local SUMMARY_COPY = {'l1', 'n1', 'l2', 'n2', 'covers', 'epoch', 'model', 'state'}

-- Drop checkpoint `id` from the hashes `checkpoints` and `sums` (its summary's copy),
-- giving its bytes back in `meta` (when the session is there). The bytes it held, or
-- false if it was not there.
local function drop_checkpoint(meta, checkpoints, sums, id)
  local body = redis.call('HGET', checkpoints, id)
  if not body then return false end
  local size = #body
  for _, name in ipairs(SUMMARY_COPY) do
    local value = redis.call('HGET', sums, id .. ':' .. name)
    if value then
      size = size + #value
      redis.call('HDEL', sums, id .. ':' .. name)
    end
  end
  redis.call('HDEL', checkpoints, id)
  if redis.call('HEXISTS', meta, 'seq') == 1 then
    local bytes = tonumber(redis.call('HGET', meta, 'bytes')) or 0
    redis.call('HSET', meta, 'bytes', math.max(0, bytes - size))
  end
  return size
end

-- `n`, a whole number, as Redis wants it: redis.call turns a Lua number into a string
-- with snprintf('%.17g'), some 2,300 instructions; this costs 1,600, call included.
local function int(n)
  return string.format('%d', n)
end

-- Make each key of `...` last at least `ttl` ms (0: for ever). TTLs only grow: a key
-- that never expires stays so, as its readers may need it for ever.
local function outlive(ttl, ...)
  for _, key in ipairs({...}) do
    if ttl == 0 then
      redis.call('PERSIST', key)
    elseif ttl > 0 then
      local left = redis.call('PTTL', key)
      if left >= 0 and left < ttl then redis.call('PEXPIRE', key, ttl) end
    end
  end
end

-- True when the whole number spelled by digits `x` is less than `y`'s. Compared as
-- written, never by tonumber: Lua's numbers are doubles, which tell 2^53 from 2^53 + 1
-- apart no more, and entry ids go to 2^64 - 1. Leading zeros count for nothing; equal
-- lengths are compared 15 digits at a time (each chunk exact as a double).
local function digits_before(x, y)
  x, y = string.match(x, '^0*(%d*)$'), string.match(y, '^0*(%d*)$')
  if #x ~= #y then return #x < #y end
  for i = 1, #x, 15 do
    local p, q = tonumber(string.sub(x, i, i + 14)), tonumber(string.sub(y, i, i + 14))
    if p ~= q then return p < q end
  end
  return false
end

-- True when entry id `a` comes before entry id `b` ('' comes before every id): their
-- milliseconds, then their sequence numbers, each compared as a 64-bit integer.
local function id_before(a, b)
  if a == '' or b == '' then return a == '' and b ~= '' end
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  if digits_before(ams, bms) then return true end
  return not digits_before(bms, ams) and digits_before(aseq, bseq)
end

-- `s` cut at each `sep` (a plain string), empty parts kept.
local function split(s, sep)
  local out, start = {}, 1
  while true do
    local at = string.find(s, sep, start, true)
    if not at then
      table.insert(out, string.sub(s, start))
      return out
    end
    table.insert(out, string.sub(s, start, at - 1))
    start = at + #sep
  end
end

-- A stream row's fields ({name, value, ...}) by name.
local function row_fields(row)
  local f = {}
  for j = 1, #row[2], 2 do f[row[2][j]] = row[2][j + 1] end
  return f
end

-- Add rows read from a stream (XRANGE's {id, {field, value...}}) to `log`, ids kept.
local function copy_rows(log, rows)
  for _, row in ipairs(rows) do redis.call('XADD', log, row[1], unpack(row[2])) end
end

-- Record a new segment's info hash `info`: its last entry `last`, the history's
-- messages and tokens there, and `holder` as a session that reads it.
local function new_segment(info, last, n, k, holder, now)
  redis.call('HSET', info, 'end', last, 'n', n, 'k', k, 'made', now, 'h:' .. holder, '0')
end

-- The segments a session reads ('owner:id,...', '-' for none): those of its chain (meta
-- 'chain') and of its branches' (hash `branches`), for the caller to release once the
-- session lets them go.
local function held_segments(meta, branches)
  local found, seen = {}, {}
  local function add(chain)
    for owner, id in string.gmatch(chain or '', '([^: ]+):([^: ]+):[^: ]+') do
      local name = owner .. ':' .. id
      if not seen[name] then
        seen[name] = true
        table.insert(found, name)
      end
    end
  end
  add(redis.call('HGET', meta, 'chain'))
  for _, value in ipairs(redis.call('HVALS', branches)) do
    local ok, branch = pcall(cjson.decode, value)
    if ok and type(branch) == 'table' and type(branch.chain) == 'string' then add(branch.chain) end
  end
  return #found > 0 and table.concat(found, ',') or '-'
end

-- The time in ms: `arg` when it is a number (an injected clock), else the server's.
local function now_ms(arg)
  local now = tonumber(arg)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- True while the lease hash `key` holds `token` and `fence` and has not expired at `now`.
local function lease_held(key, token, fence, now)
  local lease = redis.call('HMGET', key, 'token', 'fence', 'expires')
  return lease[1] == token and lease[2] == fence and tonumber(lease[3]) > now
end

-- The refusal of a write that would take the session past a size quota (0: none), or nil.
local function size_refusal(bytes, tokens, max_bytes, max_tokens)
  if max_bytes > 0 and bytes > max_bytes then
    return {'quota', 'session_bytes', tostring(max_bytes), tostring(bytes)}
  end
  if max_tokens > 0 and tokens > max_tokens then
    return {'quota', 'session_tokens', tostring(max_tokens), tostring(tokens)}
  end
  return nil
end

-- The keep hash's copy of an entry: kind, tokens, call ids, result ids, data, joined by RS.
local function keep_value(kind, tokens, calls, results, data)
  return kind .. '\30' .. tokens .. '\30' .. calls .. '\30' .. results .. '\30' .. data
end

-- The bytes a keep copy was charged: its data, not its header (see `keep_value`).
local function keep_bytes(value)
  local at = 0
  for _ = 1, 4 do
    at = string.find(value, '\30', at + 1, true)
    if not at then return #value end
  end
  return #value - at
end

-- Take `n` writes from a session's rate bucket `tokens`, `at` (meta's 'rl_tokens' and
-- 'rl_at'; nil: full), refilled at `rate` per second up to `burst`, or from `inherited`
-- ({tokens, at}: a deleted life's, see `creation`) when meta has none. Returns nil and
-- the bucket's new 'rl_tokens' and 'rl_at' (for the caller to write) when allowed (nil
-- alone with no limit: nothing to write), else the refusal.
local function rate_taken(tokens, at, n, rate, burst, inherited)
  if rate <= 0 or n <= 0 then return nil end  -- no limit: the bucket is not written
  if not tokens and inherited then tokens, at = inherited[1], inherited[2] end  -- a new life
  local now = now_ms('')
  local last = tonumber(at) or now
  local left = math.min(burst, (tonumber(tokens) or burst) + (now - last) * rate / 1000)
  if left < n then
    -- Strings: Redis would truncate a fractional Lua number to an integer.
    return {'quota', 'appends_per_second', tostring(rate), tostring(n - left)}
  end
  return nil, left - n, now
end

-- Take `n` writes from the session's rate bucket in `meta` (0: no limit; see
-- `rate_taken`). Nil when allowed (the bucket is written), else the refusal. Call it
-- after every other check: it writes.
local function take_rate(meta, n, rate, burst, inherited)
  if rate <= 0 or n <= 0 then return nil end
  local state = redis.call('HMGET', meta, 'rl_tokens', 'rl_at')
  local refusal, tokens, at = rate_taken(state[1], state[2], n, rate, burst, inherited)
  if refusal then return refusal end
  redis.call('HSET', meta, 'rl_tokens', tokens, 'rl_at', at)
  return nil
end

-- A write that finds no session creates one, and may only under a live reservation in
-- the tenant's index (token `rsv`, valid until `deadline` ms): the index then lists the
-- session before it exists. A deleted session's tombstone `gone` ("epoch seq rate_tokens
-- rate_at") carries its epoch and sequence number on, so neither ever goes backwards,
-- and its rate bucket, so a delete does not refill it.
-- Returns nil, epoch, seq, bucket ({tokens, at} or nil) when allowed, else the
-- refusal {'reserve'}.
local function creation(gone, rsv, deadline, now)
  if rsv == '' or now > (tonumber(deadline) or 0) then return {'reserve'} end
  local dead = redis.call('GET', gone)
  if dead then
    local e, s = string.match(dead, '^(%d+) (%d+)')
    local left, at = string.match(dead, '^%d+ %d+ ([%d%.]+) (%d+)$')
    return nil, tonumber(e), tonumber(s), left and {left, at} or nil
  end
  return nil, 0, 0, nil
end

-- The value of meta's field 'layout', longer than Redis's hash-max-listpack-value (64
-- bytes by default) on purpose: a hash holding such a value is kept in the hashtable
-- encoding, where reading or writing a field is a hash lookup. In the listpack encoding
-- of a small hash, each field is found by scanning the pairs before it, and an absent
-- one by scanning all: meta's 14-20 fields, read 9-14 at a time on every append and
-- view (several of them absent), cost a third of a hot view's server instructions and
-- a tenth of an append's that way. It costs some 800 bytes of memory per session.
-- Written when a session is created (`created`) and, for a session created before
-- it, when an append starts a new idempotency generation (at most one period later).
-- An idempotency generation holds it too, under '', once it has more than a few keys
-- (`IDEM_TABLE_AT` in append.lua).
local LAYOUT = '1 meta in the hashtable encoding: this value is longer than hash-max-listpack-value'

-- Record that this write created the session in `meta` under reservation `rsv` (which
-- names this life of the session): the tombstone is spent (its bucket went to
-- `rate_taken`), and a meta that held only a lease's fence no longer expires with it.
local function created(meta, gone, rsv)
  redis.call('UNLINK', gone)
  redis.call('PERSIST', meta)
  redis.call('HSET', meta, 'rsv', rsv, 'layout', LAYOUT)
end

-- The tombstone of a session whose meta held `epoch`, `seq` and the rate bucket
-- `rl_tokens` / `rl_at` (nil when none): what its next life continues from.
local function tombstone(epoch, seq, rl_tokens, rl_at)
  local tomb = ((tonumber(epoch) or 0) + 1) .. ' ' .. (tonumber(seq) + 1)
  if rl_tokens and rl_at then
    -- Rounded down: '%.3f' alone rounds 0.9996 up to a whole token, which the new life
    -- would let through where the old refused it.
    local kept = math.floor(tonumber(rl_tokens) * 1000) / 1000
    tomb = tomb .. ' ' .. string.format('%.3f', kept) .. ' ' .. rl_at
  end
  return tomb
end

-- The recorded reply of call `call` (a call's random id, the same on each retry), from
-- the session's idempotency hashes `idem` and `idem_old`, or nil. Calls other than
-- appends are recorded under '#' and their id, and so outlive a delete, a replace
-- and another pod's writes: a retry whose first run was applied (its reply lost) is
-- answered with that run's reply, never applied twice.
local function recorded(idem, idem_old, call)
  return redis.call('HGET', idem, '#' .. call) or redis.call('HGET', idem_old, '#' .. call)
end

-- Record `reply` as call `call`'s, for at least `period` ms (see `recorded`).
local function record(idem, call, reply, period)
  redis.call('HSET', idem, '#' .. call, reply)
  local ttl = redis.call('PTTL', idem)
  if ttl < 2 * period then redis.call('PEXPIRE', idem, 2 * period) end
end

-- A stream entry's fields: m (the message), t (tokens), then c (call ids), r (result
-- ids), v and vt (the preview and its tokens) when there are any, and n and k: the
-- history's messages and tokens up to and including this one (so a fork or a rewind
-- to it reads no other).
local function entry_fields(data, tokens, calls, results, preview, preview_tokens, n, k)
  local fields = {'m', data, 't', tokens}
  local i = 4
  if calls ~= '' then fields[i + 1], fields[i + 2], i = 'c', calls, i + 2 end
  if results ~= '' then fields[i + 1], fields[i + 2], i = 'r', results, i + 2 end
  if preview ~= '' then
    fields[i + 1], fields[i + 2], fields[i + 3], fields[i + 4], i =
      'v', preview, 'vt', preview_tokens, i + 4
  end
  fields[i + 1], fields[i + 2], fields[i + 3], fields[i + 4] = 'n', n, 'k', k
  return fields
end

-- Add entries given in `argv` (a script's ARGV: a function of the library gets its own)
-- from `at` on, 9 each (id, m, t, c, r, v, vt, n, k), to `log`, their ids kept; the bytes
-- they hold.
local function add_given(log, argv, at, count)
  local bytes = 0
  for i = 0, count - 1 do
    local a = at + i * 9
    redis.call('XADD', log, argv[a], unpack(entry_fields(argv[a + 1], argv[a + 2], argv[a + 3],
               argv[a + 4], argv[a + 5], argv[a + 6], argv[a + 7], argv[a + 8])))
    bytes = bytes + #argv[a + 1] + #argv[a + 5]
  end
  return bytes
end

-- `argv` from `at`: a count, then that many pairs; the pairs (flat), and the index after.
local function given_pairs(argv, at)
  local out = {}
  for i = 1, tonumber(argv[at]) do
    table.insert(out, argv[at + 2 * i - 1])
    table.insert(out, argv[at + 2 * i])
  end
  return out, at + 1 + 2 * tonumber(argv[at])
end

-- Add one message to the stream `log` and, for a system or pinned one (kind 's'
-- or 'p'), its copy to `keep`; the entry id.
local function add_entry(log, keep, data, tokens, kind, calls, results, preview, preview_tokens,
                         n, k)
  local id
  if calls == '' and results == '' and preview == '' then  -- most messages: no table
    id = redis.call('XADD', log, '*', 'm', data, 't', tokens, 'n', n, 'k', k)
  else
    id = redis.call('XADD', log, '*', unpack(entry_fields(data, tokens, calls, results, preview,
                                                          preview_tokens, n, k)))
  end
  if kind ~= '' then
    redis.call('HSET', keep, id, keep_value(kind, tokens, calls, results, data))
  end
  return id
end


-- Raise the session's summary flag in `meta` and return the job generation to queue.
-- Generations are times, made strictly increasing, so a job id is never
-- reused, not even by a session deleted and written again (arq refuses ids
-- it still keeps a result for). `now` may be an entry id's ms, which can pass 2^53
-- (an imported history's): past it a double's + 1 adds nothing, so a time taken
-- from there is held below it.
local function next_generation(meta, now)
  local gen = math.max((tonumber(redis.call('HGET', meta, 'sgen')) or 0) + 1,
                       math.min(now, 2 ^ 52))
  redis.call('HSET', meta, 'sq', '1', 'sq_at', now, 'sgen', gen)
  return gen
end

-- The reservations pending for `session` in the tenant's `pending` hash ("token:deadline,...")
-- that end at or after `after` ms, without `drop` (a token, or ''). Written back (the field
-- and its entry in `due`, by latest deadline, go when none is left). Returns how many are left.
local function keep_pending(pending, due, session, after, drop)
  local kept, latest = {}, nil
  for token, deadline in string.gmatch(redis.call('HGET', pending, session) or '', '([^:,]+):(%d+)') do
    local d = tonumber(deadline)
    if token ~= drop and d >= after then
      table.insert(kept, token .. ':' .. deadline)
      if not latest or d > latest then latest = d end
    end
  end
  if #kept == 0 then
    redis.call('HDEL', pending, session)
    redis.call('ZREM', due, session)
  else
    redis.call('HSET', pending, session, table.concat(kept, ','))
    redis.call('ZADD', due, latest, session)
  end
  return #kept
end
