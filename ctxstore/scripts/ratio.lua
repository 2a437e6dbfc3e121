-- ratio: learn how many of a model's tokens one stored (cl100k) token is, per tenant.
--
-- KEYS[1] the tenant's ratios (hash: model -> "factor ewma samples updated_ms")
-- ARGV[1] the model
-- ARGV[2] 'usage' (the provider counted ARGV[3] of its tokens for a view the store
--         counted as ARGV[4]) or 'overflow' (the provider refused a view as too long)
-- ARGV[3] the provider's tokens (usage) or ''
-- ARGV[4] the store's tokens (usage) or ''
-- ARGV[5] the factor to start from (the configured one), ARGV[6] the margin added to
--         the observed ratio, ARGV[7] the smoothing (0..1), ARGV[8] the step the factor
--         in force moves by, ARGV[9] the most models kept, ARGV[10] now in ms ('' server)
--
-- Race it closes: pods of one tenant report usage at once; each update reads and
-- writes the model's ratio in one step, so none is lost. The factor in force
-- moves only by whole steps (hysteresis): budgets, and so the views' anchors,
-- change seldom, not with every report. Bounded: the oldest model goes first.
--
-- Returns the factor in force, as a string.
local now = now_ms(ARGV[10])
local start, margin = tonumber(ARGV[5]), tonumber(ARGV[6])
local alpha, step = tonumber(ARGV[7]), tonumber(ARGV[8])
local held = redis.call('HGET', KEYS[1], ARGV[1])
local factor, ewma, samples = start, start - margin, 0
if held then
  local f, e, n = string.match(held, '^(%S+) (%S+) (%d+)')
  factor, ewma, samples = tonumber(f), tonumber(e), tonumber(n)
end
if ARGV[2] == 'overflow' then
  -- The provider counted more than the budget: grow at once, by a step at least.
  factor = math.min(4, factor * 1.15 + step)
  ewma = math.max(ewma, factor - margin)
else
  local observed = tonumber(ARGV[3]) / math.max(1, tonumber(ARGV[4]))
  observed = math.max(0.5, math.min(4, observed))
  ewma = samples == 0 and observed or ewma + alpha * (observed - ewma)
  samples = samples + 1
  local wanted = math.max(1, math.min(4, ewma + margin))
  if math.abs(wanted - factor) >= step then
    factor = math.floor(wanted / step + 0.5) * step
  end
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.4f %.4f %d %d', factor, ewma, samples, now))
local models = redis.call('HKEYS', KEYS[1])
if #models > tonumber(ARGV[9]) then
  local oldest, at = nil, nil
  for _, model in ipairs(models) do
    local t = tonumber(string.match(redis.call('HGET', KEYS[1], model), '(%d+)$'))
    if not at or t < at then oldest, at = model, t end
  end
  redis.call('HDEL', KEYS[1], oldest)
end
return string.format('%.4f', factor)
