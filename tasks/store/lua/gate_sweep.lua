-- Mend the fairness gate's counts (the pump, every few seconds): a turn counted in flight whose
-- record ended or went away without its ending releasing it, or that is neither running nor
-- admitted and unclaimed (its message was used up, or went stale, without a claim releasing
-- it), and an admitted turn whose message nobody claimed for stale_ms (a worker died with it
-- prefetched; the pump wakes those turns anyway), stop counting. -> how many were mended
local g, limit = A.gate, tonumber(A.limit)
local now = now_ms()
local mended = 0
local stale = redis.call('ZRANGEBYSCORE', g .. ':unclaimed', '-inf', now - tonumber(A.stale_ms),
  'LIMIT', 0, limit)
for _, turn_id in ipairs(stale) do
  redis.call('ZREM', g .. ':unclaimed', turn_id)
  gate_release(g, turn_id)
  mended = mended + 1
end
local cursor = '0'
local seen = 0
repeat
  local page = redis.call('HSCAN', g .. ':owners', cursor, 'COUNT', 100)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local turn_id, owner = page[2][i], page[2][i + 1]
    seen = seen + 1
    local turn_key = redis.call('HGET', g .. ':keys', turn_id)
    local state = turn_key and redis.call('HGET', turn_key, F.state)
    local idle = state ~= STATE.RUNNING and not redis.call('ZSCORE', g .. ':unclaimed', turn_id)
    if not state or is_terminal(state) or idle or redis.call('HGET', turn_key, F.gate) ~= g then
      if state then redis.call('HDEL', turn_key, F.gate) end
      redis.call('HDEL', g .. ':keys', turn_id)
      gate_release(g, turn_id)
      mended = mended + 1
    end
  end
until cursor == '0' or seen >= limit
return mended
