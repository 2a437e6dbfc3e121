-- checkpoint_delete: drop one checkpoint and its copy of the summary, in one step.
--
-- KEYS[1] meta, KEYS[2] checkpoints, KEYS[3] checkpoint summaries,
-- KEYS[4] idem, KEYS[5] idem_old (where this call's reply is recorded)
-- ARGV[1] the checkpoint's id
-- ARGV[2] this call's id (random, the same on every retry of the call)
-- ARGV[3] idempotency period, ms: how long this call's reply is kept for a retry
--
-- Race it closes: the record, its summary's values and the bytes they count
-- against the session's quota go together, so two pods dropping the same
-- checkpoint give its bytes back once. A retry of a call whose reply was lost
-- is answered with its first reply (it was there), not with the retry's.
--
-- Returns 1 if it was there, 0 if not.
local prev = recorded(KEYS[4], KEYS[5], ARGV[2])
if prev then return tonumber(prev) end
local found = drop_checkpoint(KEYS[1], KEYS[2], KEYS[3], ARGV[1]) and 1 or 0
if found == 1 then record(KEYS[4], ARGV[2], '1', tonumber(ARGV[3])) end
return found
