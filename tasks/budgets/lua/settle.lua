-- Settle a reserved call with what it used: its amount in each limit becomes the actual, from
-- now on for a window. Once per call: a second settle (or one after the hold expired) is a no-op.
-- KEYS: holds, then log, amounts, total for each limit. ARGV: call id, keep ms, then the actual
-- amount for each limit ('' keeps the reservation).
-- -> 1 settled, 0 nothing to settle
local call_id, keep_ms = ARGV[1], tonumber(ARGV[2])
if redis.call('ZREM', KEYS[1], call_id) == 0 then return 0 end
local now = now_ms()
for i = 1, (#KEYS - 1) / 3 do
  local log, amounts, total = KEYS[2 + (i - 1) * 3], KEYS[3 + (i - 1) * 3], KEYS[4 + (i - 1) * 3]
  local actual = ARGV[2 + i]
  if actual ~= '' then
    local held = tonumber(redis.call('HGET', amounts, call_id) or '0')
    redis.call('HSET', amounts, call_id, actual)
    redis.call('INCRBY', total, tonumber(actual) - held)
  end
  redis.call('ZADD', log, now, call_id)
  for _, k in ipairs({log, amounts, total}) do keep(k, keep_ms) end
end
return 1
