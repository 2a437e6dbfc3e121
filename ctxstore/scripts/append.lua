-- append: add messages to a session, in one step, without a lock.
--
-- Two forms. The full form declares 12 keys and 13 arguments before the messages; the
-- lean form, the steady state of most sessions, only the first 4 keys and 5 arguments
-- (each argument costs Redis some 2,000 instructions, a plain XADD all told 17,500), or
-- 10 when a default TTL or a quota is in force (ARGV[5] negative: the full form's
-- ARGV[6..10] follow). The lean form is refused with {'keys'}, nothing written, when
-- the write needs more: the session's expiry is due to move or to go (every key's: see
-- `stretch` and `unbound`), or a message is system or pinned.
--
-- KEYS[1] log    stream, one entry per message
-- KEYS[2] meta   hash: epoch, seq, count, tokens, first/last id, watermark...
-- KEYS[3] idem   hash: idempotency key -> "entry-id seq epoch" (current generation), and
--                '' -> `LAYOUT` once it holds more than IDEM_TABLE_AT keys
-- KEYS[4] idem_old  the previous generation of idem
-- the full form only:
-- KEYS[5] keep   hash: entry id -> header and copy of each message every view sends
-- KEYS[6] gone   a deleted session's tombstone: "epoch seq [rate_tokens rate_at]"
-- KEYS[7] view   the cached summary (only its TTL is touched here)
-- KEYS[8] anchor the views' anchors (only its TTL is touched here)
-- KEYS[9] index  the search index (only its TTL is touched here)
-- KEYS[10] checkpoints, KEYS[11] checkpoint summaries, KEYS[12] branches (TTLs only)
-- ARGV[1] expected seq, or '' to append unconditionally
-- ARGV[2] idempotency window: keys per generation, at most
-- ARGV[3] summary threshold: tokens past the watermark that make a summary due (0: never)
-- ARGV[4] n, the number of messages; -n when every idempotency key is new: made by the
--         SDK for this call, on its first attempt (so none is looked up: a retry, whose
--         first attempt may have written, sends n)
-- ARGV[5] idempotency period (ms): a generation also ends after this long; it
--         expires two periods after it began (one after it ends, once renamed old).
--         Negative in a lean form that carries ARGV[6..10].
-- the full form only (the lean form has no reservation or clock, and ARGV[6..10] only
-- when ARGV[5] is negative: otherwise no default TTL and no quota):
-- ARGV[6] default TTL in ms, or '' (a TTL set on the session wins)
-- ARGV[7] quota: the most bytes in the session (0: none)
-- ARGV[8] quota: the most tokens in the session (0: none)
-- ARGV[9] quota: appends per second for the session (0: none)
-- ARGV[10] quota: the burst that rate allows
-- ARGV[11] the index reservation this write may create the session under ('' for none)
-- ARGV[12] that reservation's deadline, ms
-- ARGV[13] now in ms, or '' to use the Redis server's clock
-- then 8 per message:
--         data, tokens, idempotency key, kind ('s', 'p' or ''), call ids, result ids
--         (joined by \x1f), preview ('' or JSON), preview tokens
--      or 3 per message (the bare form: no message of the call has a kind, an id or a
--         preview, as most have none): data, tokens, idempotency key. Each argument costs
--         Redis some 900 instructions even empty, and such a message's last five are.
--
-- Races it closes: a retry of an append that Redis applied before the
-- connection broke is answered with the original entry (the idempotency
-- key), not written twice; an append-if whose expected seq is stale is
-- refused before anything is written; a quota that would be exceeded is
-- refused before anything is written (a retry of an applied append is still
-- answered, quota or not); counters and stream change together, so meta
-- always matches the stream. Redis orders concurrent appends: no lock. A
-- session is created only under a live reservation of the tenant's index
-- (so it is listed, and counted by the session quota, before it exists), and
-- a session deleted and written again continues its epoch and sequence.
--
-- Returns, when it is applied, one string of words cut by spaces (Redis spent some 8,600
--      instructions sending a table of ten; the string saves an append some 7,000, 4.5%,
--      with its join, which for a single new message is one concatenation, not table.concat):
--      'ok', due_generation, created 0/1, the session's TTL in ms as stored or sent (set_ttl
--      stores a Lua number, which may read in exponent form; '' for none), the ms its
--      keys have left after this write (the SDK sends the full form once that is under the
--      TTL; '' with no TTL, -1 when this write took a removed TTL's expiry away), then
--      entry id, seq, epoch, duplicate 0/1 per message, and last the session's chain ('' for
--      none: lineage.py), which holds spaces. Refused, a table:
--      {'conflict', current seq, fresh 0/1, now}, {'quota', name, limit, value, fresh, now},
--      {'reserve'} (no live reservation for a session this would create) or {'keys'}
--      (the lean form, for a write that needs the full one).

-- The generation's keys after which its hash takes the layout field ('' and `LAYOUT`: no
-- idempotency key is empty, nor is any other call's record, '#' and its id), and so
-- Redis's hashtable encoding. As a listpack, which Redis keeps up to hash-max-listpack-entries
-- (512 by default), each HSET scans every key before it: a session appended to one
-- message at a time paid 11k more instructions per append at 64-128 keys, and 22k at
-- 128-256, than as a hashtable. Up to 16 keys the scan costs less than the conversion's
-- memory is worth: a hashtable holds each key in some 60 bytes more (a 128-key generation
-- takes 12.5 KB, against 5.2 KB), for the one or two generations of the last two periods.
local IDEM_TABLE_AT = 16
-- The most a session's expiry runs past its TTL (ms; see `stretch`). No more than
-- lineage.py's KEEP_ALIVE_MS: the segments a fork's history starts in are stretched that
-- often, to outlast the session by twice that.
local TTL_SLACK_MOST = 60000
local lean = #KEYS == 4
local period = ARGV[5] + 0
local limited = period < 0  -- a lean form with the limits (ARGV[6..10])
if limited then period = -period end
local FIRST = lean and (limited and 10 or 5) or 13  -- ARGV index before the first message's
-- The full form's arguments, as the lean form stands for them.
local default_ttl, quota_bytes, quota_tokens, quota_rate, quota_burst, rsv, deadline, clock
if lean then
  if limited then
    default_ttl, quota_bytes, quota_tokens = ARGV[6], ARGV[7], ARGV[8]
    quota_rate, quota_burst = ARGV[9], ARGV[10]
  else
    default_ttl, quota_bytes, quota_tokens, quota_rate = '', '0', '0', '0'
  end
  rsv, deadline, clock = '', '0', ''
else
  default_ttl, quota_bytes, quota_tokens, quota_rate = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
  quota_burst, rsv, deadline, clock = ARGV[10], ARGV[11], ARGV[12], ARGV[13]
end
-- Each field read costs some 2,500 instructions: 'idle' is read only when a summary may be due,
-- the rate bucket only under a rate quota (read and written with the rest of meta: its own
-- HMGET and HSET cost such an append some 10,000 more). The two lists differ only by the
-- bucket's fields, 13 and 14: keep them in step (a list built as a table and unpacked
-- cost every append 2,000-3,000 more).
local rated = quota_rate ~= '0'
local meta
if rated then
  meta = redis.call('HMGET', KEYS[2], 'seq', 'epoch', 'count', 'tokens', 'ttl', 'idem_n',
                    'wm_tokens', 'sq', 'first_id', 'idem_since', 'bytes', 'chain',
                    'rl_tokens', 'rl_at')
else
  meta = redis.call('HMGET', KEYS[2], 'seq', 'epoch', 'count', 'tokens', 'ttl', 'idem_n',
                    'wm_tokens', 'sq', 'first_id', 'idem_since', 'bytes', 'chain')
end
-- Numbers from strings by arithmetic, not tonumber(), which parses each twice.
local seq = nil  -- none: the session does not exist
if meta[1] then seq = meta[1] + 0 end
local epoch = (meta[2] or 0) + 0
local count = (meta[3] or 0) + 0
local tokens = (meta[4] or 0) + 0
local idem_n = (meta[6] or 0) + 0
local n = ARGV[4] + 0
local made = n < 0  -- every key new: none can have been recorded
if made then n = -n end
local PER = (#ARGV - FIRST) / n  -- the arguments of each message: 8, or 3 in the bare form
local bare = PER == 3
local ttl = tonumber(meta[5]) or tonumber(default_ttl)
-- A session with a TTL has every key's expiry moved only when the log or meta would
-- otherwise expire sooner than `ttl` after this write (or later than `span`: the TTL
-- was lowered), and then to `span`, `ttl` plus a tenth of it, at most TTL_SLACK_MOST:
-- it expires between `ttl` and `span` after its last write, and most appends move
-- nothing (nine PEXPIREs were 30% of such an append). The log is checked as well as
-- meta: a fork's freeze may leave it to be made anew, without an expiry.
-- With no TTL in force, a session whose meta still expires had one that was removed (a
-- default its tenant or pod no longer sets, or another write path's): every key's expiry
-- goes (`unbound`), or the session would expire under its writes at the old time. The
-- PTTL costs every such append some 3,400 instructions (2.3%); a per-pod memo of the
-- sessions checked would save it, but misses the TTLs other write paths and other pods
-- give in between.
local stretch, unbound, span, left = false, false, nil, ''
if ttl and ttl > 0 then
  span = ttl + math.min(math.floor(ttl / 10), TTL_SLACK_MOST)
  local log_left, meta_left = redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2])
  stretch = log_left < ttl or meta_left < ttl or log_left > span or meta_left > span
  left = math.min(log_left, meta_left)
  if lean and stretch then return {'keys'} end  -- every key's expiry must move
elseif seq and redis.call('PTTL', KEYS[2]) >= 0 then
  if lean then return {'keys'} end
  unbound = true
end

local seen = {}
local fresh = 0
if made then
  fresh = n
else
  for i = 1, n do
    local key = ARGV[FIRST + (i - 1) * PER + 3]
    -- The previous generation too, even with no meta: a delete keeps both.
    local prev = redis.call('HGET', KEYS[3], key) or redis.call('HGET', KEYS[4], key)
    seen[i] = prev
    if not prev then fresh = fresh + 1 end
  end
end

local creating = seq == nil and fresh > 0
-- The time only when a creation or a refusal needs it: the steady state reads no clock.
local now = nil
local bucket = nil
if creating then
  now = now_ms(clock)
  local refusal
  -- With no reservation (as in the lean form) this is refused before `gone` is read.
  refusal, epoch, seq, bucket = creation(KEYS[6], rsv, deadline, now)
  if refusal then return refusal end
end
seq = seq or 0
local is_new = creating and 1 or 0

if fresh > 0 and ARGV[1] ~= '' and ARGV[1] + 0 ~= seq then
  return {'conflict', seq, is_new, now or now_ms(clock)}
end

local bytes = (meta[11] or 0) + 0
local rl_tokens, rl_at = nil, nil  -- the rate bucket after this write, under a rate quota
if fresh > 0 then
  local new_bytes, new_tokens = 0, 0
  for i = 1, n do
    if not seen[i] then
      local base = FIRST + (i - 1) * PER
      local size = #ARGV[base + 1]
      if not bare then
        -- A system or pinned message is stored twice: in the stream and as its keep copy.
        if ARGV[base + 4] ~= '' then
          if lean then return {'keys'} end  -- the keep hash is the full form's
          size = size * 2
        end
        size = size + #ARGV[base + 7]  -- and a large tool result's preview beside it
      end
      new_bytes = new_bytes + size
      new_tokens = new_tokens + ARGV[base + 2]
    end
  end
  -- A quota of 0 is none: most sessions have none, and skip the arithmetic.
  local refusal = nil
  if quota_bytes ~= '0' or quota_tokens ~= '0' then
    refusal = size_refusal(bytes + new_bytes, tokens + new_tokens,
                           tonumber(quota_bytes), tonumber(quota_tokens))
  end
  if not refusal and rated then
    refusal, rl_tokens, rl_at = rate_taken(meta[13], meta[14], fresh, tonumber(quota_rate),
                                           tonumber(quota_burst), bucket)
  end
  if refusal then
    table.insert(refusal, is_new)
    table.insert(refusal, now or now_ms(clock))
    return refusal
  end
  bytes = bytes + new_bytes
end

if creating then created(KEYS[2], KEYS[6], rsv) end

local window = ARGV[2] + 0
local since = (meta[10] or 0) + 0
local since_changed = false
-- The reply's words but the chain, which goes last (see Returns above): strings, as a
-- number would be formatted by the join (`int` costs less).
local ttl_s = ''  -- the TTL as stored or sent: none is formatted for it
if ttl then ttl_s = tonumber(meta[5]) and meta[5] or default_ttl end
local out = {'ok', '0', creating and '1' or '0', ttl_s, span and int(left) or ''}
local o = 5  -- the last index of `out` set
local answers = false  -- a new message answers a tool call: an open exchange may be closed
local kept = false  -- a new message is system or pinned: the keep hash changed
local first_id = meta[9]
local first_changed = false
local last_id = nil
-- The numbers as Redis takes them, each formatted once (`int`): the last new message's
-- seq, count and tokens are also the session's, and the epoch is read as a string.
local epoch_s = (not creating and meta[2]) or int(epoch)
local seq_s, count_s, tokens_s
for i = 1, n do
  local base = FIRST + (i - 1) * PER
  if seen[i] then
    local id, s, e = string.match(seen[i], '^(%S+) (%d+) (%d+)$')
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, s, e, '1'
    o = o + 4
  else
    local t = ARGV[base + 2] + 0
    seq = seq + 1
    count = count + 1
    tokens = tokens + t
    seq_s, count_s, tokens_s = int(seq), int(count), int(tokens)
    local id
    if bare then
      id = add_entry(KEYS[1], KEYS[5], ARGV[base + 1], ARGV[base + 2], '', '', '', '', '',
                     count_s, tokens_s)
    else
      id = add_entry(KEYS[1], KEYS[5], ARGV[base + 1], ARGV[base + 2], ARGV[base + 4],
                     ARGV[base + 5], ARGV[base + 6], ARGV[base + 7], ARGV[base + 8],
                     count_s, tokens_s)
      answers = answers or ARGV[base + 6] ~= ''
      kept = kept or ARGV[base + 4] ~= ''
    end
    if not first_id or first_id == '' then first_id, first_changed = id, true end
    last_id = id
    local at = string.match(id, '^(%d+)') + 0
    if not since_changed and (idem_n >= window or at - since >= period) then
      -- Rotate in O(1): keys are remembered for at least one period (or one
      -- window of appends), and at most two. Once a call: a second rotation would
      -- drop the keys this call put in the first, and a retry of it write them again.
      if idem_n > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
        redis.call('RENAME', KEYS[3], KEYS[4])
        redis.call('PEXPIRE', KEYS[4], period)
      end
      idem_n = 0
      since = at
      since_changed = true
    end
    local value = id .. ' ' .. seq_s .. ' ' .. epoch_s
    if idem_n == IDEM_TABLE_AT then  -- from now on a lookup, not a scan (see IDEM_TABLE_AT)
      redis.call('HSET', KEYS[3], ARGV[base + 3], value, '', LAYOUT)
    else
      redis.call('HSET', KEYS[3], ARGV[base + 3], value)
    end
    -- A generation takes at most one period of appends, and expires two periods after
    -- it began: each key is kept at least one period, with one PEXPIRE per generation.
    if idem_n == 0 then redis.call('PEXPIRE', KEYS[3], 2 * period) end
    idem_n = idem_n + 1
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, seq_s, epoch_s, '0'
    o = o + 4
  end
end

-- Even for a retry that adds nothing (its pod would go lean, and be refused, again).
if unbound then
  for _, k in ipairs({1, 2, 5, 7, 8, 9, 10, 11, 12}) do redis.call('PERSIST', KEYS[k]) end
  out[5] = '-1'  -- the writer makes the segments its history starts in last for ever too
end
if fresh == 0 then
  out[o + 1] = meta[12] or ''
  return table.concat(out, ' ')
end

-- Only what changes on every append; the epoch, the first id and the idempotency
-- generation's start, when they change (each field written costs some 3,000 instructions
-- in a listpack, 1,000 in a hashtable), and then the layout of a session created before
-- meta had one (its first new generation moves it to the hashtable encoding: `LAYOUT`).
if rl_at then  -- the same fields as below, and the rate bucket: keep them in step
  redis.call('HSET', KEYS[2], 'seq', seq_s, 'count', count_s, 'tokens', tokens_s,
             'bytes', int(bytes), 'idem_n', int(idem_n), 'last_id', last_id,
             'rl_tokens', rl_tokens, 'rl_at', rl_at)
else
  redis.call('HSET', KEYS[2], 'seq', seq_s, 'count', count_s, 'tokens', tokens_s,
             'bytes', int(bytes), 'idem_n', int(idem_n), 'last_id', last_id)
end
if creating or not meta[2] or first_changed or since_changed then
  redis.call('HSET', KEYS[2], 'epoch', epoch_s, 'first_id', first_id, 'idem_since', int(since),
             'layout', LAYOUT)
end
-- The keep hash's version: a pod's cached view reads the protected copies again.
if kept then redis.call('HINCRBY', KEYS[2], 'kv', 1) end

local threshold = ARGV[3] + 0
if threshold > 0 and meta[8] ~= '1' and tokens - (meta[7] or 0) >= threshold then
  -- After a job that could cover nothing, only what may change that: a tool
  -- result (an open exchange closed), or half a threshold of new tokens.
  local idle = tonumber(redis.call('HGET', KEYS[2], 'idle'))
  if not idle or answers or tokens - idle >= threshold / 2 then
    redis.call('HDEL', KEYS[2], 'idle')
    out[2] = int(next_generation(KEYS[2], tonumber(string.match(last_id, '^(%d+)'))))
  end
end

-- A new keep copy, like a due stretch, moves every key's expiry (the keep hash may be new).
if stretch or (kept and span) then
  local until_ms = int(span)
  for _, k in ipairs({1, 2, 5, 7, 8, 9, 10, 11, 12}) do redis.call('PEXPIRE', KEYS[k], until_ms) end
  out[5] = until_ms
end
if n == 1 then  -- most appends: one string joined by one concatenation
  return out[1] .. ' ' .. out[2] .. ' ' .. out[3] .. ' ' .. out[4] .. ' ' .. out[5] .. ' ' .. out[6] .. ' '
    .. out[7] .. ' ' .. out[8] .. ' ' .. out[9] .. ' ' .. (meta[12] or '')
end
out[o + 1] = meta[12] or ''
return table.concat(out, ' ')
