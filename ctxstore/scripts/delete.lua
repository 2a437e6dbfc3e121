-- delete: remove every key of one session.
--
-- KEYS: every key of the session (log, meta, view, lease, idem, idem_old, keep)
--
-- One step, so no reader sees half a session. The tenant's index lives in
-- another slot; the caller removes the session from it in the same pipeline.
--
-- Returns the number of keys that existed.
return redis.call('DEL', unpack(KEYS))
