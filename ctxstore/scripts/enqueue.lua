-- enqueue: put a summary job on an arq queue, in arq's own format, without arq.
--
-- KEYS[1] arq:job:<id>     the job (arq's serialized dict, here JSON)
-- KEYS[2] arq:result:<id>  a kept result of the same id
-- KEYS[3] the queue        sorted set: job id -> when it may run (ms)
-- ARGV[1] the job id
-- ARGV[2] the job: {"t": null, "f": function, "a": args, "k": {}, "et": enqueued at, ms}
-- ARGV[3] how long the job key lasts, ms
-- ARGV[4] the score: when it may run (the enqueue time), ms
--
-- Race it closes: arq's own enqueue WATCHes the job key; pods that queue
-- the same generation at once must leave exactly one job, and never one
-- whose id arq still keeps a result for. The check and the write are one
-- step here, so pods need arq neither installed nor in the same version of
-- redis-py: the arq worker reads what this wrote.
--
-- Returns 1 when queued, 0 when arq already has that job id.
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('PSETEX', KEYS[1], tonumber(ARGV[3]), ARGV[2])
redis.call('ZADD', KEYS[3], tonumber(ARGV[4]), ARGV[1])
return 1
