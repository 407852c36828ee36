-- The pump, for a turn of the token index that is due: once the turn ended ttl_ms ago, remove
-- the token.delta events from its stream (the other events stay as long as the record) and the
-- turn from the index. -> 0 when removed, else the time it is due again (server epoch ms): the
-- end plus ttl_ms, or, for a turn still unfinished, now plus ttl_ms.
local ttl_ms = tonumber(A.ttl_ms)
local now = now_ms()
local ended = redis.call('HMGET', K.turn, F.state, F.finished_at_ms)
local again = nil
if ended[1] and not is_terminal(ended[1]) then
  again = now + ttl_ms
elseif ended[1] and tonumber(ended[2] or '0') + ttl_ms > now then
  again = tonumber(ended[2]) + ttl_ms
end
if again then
  redis.call('ZADD', K.tokens, again, A.turn_id)
  return again
end
local batch = 500
local from = '-'
repeat
  local entries = redis.call('XRANGE', K.events, from, '+', 'COUNT', batch)
  local deltas = {}
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    for i = 1, #fields - 1, 2 do
      if fields[i] == EF.type then
        if fields[i + 1] == EVENT.TOKEN_DELTA then deltas[#deltas + 1] = entry[1] end
        break
      end
    end
  end
  if #deltas > 0 then redis.call('XDEL', K.events, unpack(deltas)) end
  if #entries > 0 then from = '(' .. entries[#entries][1] end
until #entries < batch
redis.call('ZREM', K.tokens, A.turn_id)
return 0
