-- Reserve one model call against a budget: every limit admits it or none is charged.
-- KEYS: holds, closed, waiters, then log, amounts, total for each limit.
-- ARGV: call id, waiter id (the turn), hold ms, keep ms, then amount, window ms, need, label
-- for each limit.
-- -> {1} reserved | {2, label, due ms} wait | {3, label} the need exceeds the whole limit |
--    {4, until ms} closed by a 429
local call_id, waiter = ARGV[1], ARGV[2]
local hold_ms, keep_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local holds, closed, waiters = KEYS[1], KEYS[2], KEYS[3]
local limits = (#KEYS - 3) / 3
local now = now_ms()

local function key(i, part) return KEYS[3 + (i - 1) * 3 + part] end
local function arg(i, part) return ARGV[4 + (i - 1) * 4 + part] end

for i = 1, limits do
  if tonumber(arg(i, 3)) > tonumber(arg(i, 1)) then return {3, arg(i, 4)} end
end
local until_ms = tonumber(redis.call('GET', closed) or '0')
if until_ms > now then return {4, until_ms} end
-- The same call reserved already (a write that was sent twice): it holds its reservation.
if redis.call('ZSCORE', holds, call_id) then return {1} end

-- Reservations a worker never settled (it died during the call) count as spent from when
-- they expire, for a window more.
local expired = redis.call('ZRANGEBYSCORE', holds, '-inf', now, 'LIMIT', 0, CHUNK)
if #expired > 0 then
  for i = 1, limits do
    for _, id in ipairs(expired) do redis.call('ZADD', key(i, 1), now, id) end
  end
  redis.call('ZREM', holds, unpack(expired))
end

-- Turns waiting for this budget whose wake-up is long past are gone (ended, cancelled).
redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now - keep_ms)

local wait_label, wait_due = nil, 0
for i = 1, limits do
  local amount, window_ms, need = tonumber(arg(i, 1)), tonumber(arg(i, 2)), tonumber(arg(i, 3))
  local total = prune(key(i, 1), key(i, 2), key(i, 3), window_ms, now)
  if total + need > amount then
    -- When enough frees for this call and for each turn that waits ahead of it (as much each),
    -- so that waiting turns wake one after another rather than all at once.
    local score = redis.call('ZSCORE', waiters, waiter)
    local ahead
    if score then
      ahead = redis.call('ZCOUNT', waiters, '-inf', '(' .. score)
    else
      ahead = redis.call('ZCARD', waiters)
    end
    local due = frees_at(key(i, 1), key(i, 2), window_ms, total + need * (ahead + 1) - amount)
    if not due then
      -- Reservations in flight hold the rest: they settle within a call's time.
      due = now + math.min(1000, math.max(50, math.floor(window_ms / 20)))
    end
    if due > wait_due then wait_label, wait_due = arg(i, 4), due end
  end
end
if wait_label then
  redis.call('ZADD', waiters, wait_due, waiter)
  keep(waiters, keep_ms)
  return {2, wait_label, wait_due}
end

redis.call('ZREM', waiters, waiter)
redis.call('ZADD', holds, now + hold_ms, call_id)
keep(holds, keep_ms)
for i = 1, limits do
  redis.call('HSET', key(i, 2), call_id, arg(i, 3))
  redis.call('INCRBY', key(i, 3), arg(i, 3))
  for part = 1, 3 do keep(key(i, part), keep_ms) end
end
return {1}
