-- _lib: functions the scripts share. Script.load puts this file in front of
-- every script, so each one is still sent (and cached) as a single source.

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

-- Add one message to the stream `log` and, for a system or pinned one (kind 's'
-- or 'p'), its copy to `keep`; the entry id. Stream fields: m (the message),
-- t (tokens), then c (call ids), r (result ids), v and vt (the preview and its
-- tokens) when there are any.
local function add_entry(log, keep, data, tokens, kind, calls, results, preview, preview_tokens)
  local fields = {'m', data, 't', tokens}
  if calls ~= '' then table.insert(fields, 'c') table.insert(fields, calls) end
  if results ~= '' then table.insert(fields, 'r') table.insert(fields, results) end
  if preview ~= '' then
    table.insert(fields, 'v') table.insert(fields, preview)
    table.insert(fields, 'vt') table.insert(fields, preview_tokens)
  end
  local id = redis.call('XADD', log, '*', unpack(fields))
  if kind ~= '' then
    redis.call('HSET', keep, id, keep_value(kind, tokens, calls, results, data))
  end
  return id
end

