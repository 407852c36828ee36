-- Members of a time index due by the server's clock (minus lag_ms), each re-scored bump_ms
-- later so another pump (or the next tick) does not take it again while its wake-up is on the
-- way. -> {turn_id, namespace, agent, conversation_id, ...} from the turn records ('' when gone).
local limit, bump_ms, lag_ms = tonumber(A.limit), tonumber(A.bump_ms), tonumber(A.lag_ms)

local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', K.index, '-inf', now - lag_ms, 'LIMIT', 0, limit)
local out = {}
for _, member in ipairs(due) do
  redis.call('ZADD', K.index, now + bump_ms, member)
  local record = redis.call('HMGET', A.turn_prefix .. member, F.namespace, F.agent,
    F.conversation_id)
  out[#out + 1] = member
  out[#out + 1] = record[1] or ''
  out[#out + 1] = record[2] or ''
  out[#out + 1] = record[3] or ''
end
return out
