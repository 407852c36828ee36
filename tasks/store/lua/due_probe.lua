-- Which time indices hold a member due by the server's clock, read from one member of each, so
-- the pump runs take_due only where something is due (tasks/turn/pump.py). A.indices holds
-- "key lag_ms" pairs, space-separated, of many shards (records.py, due_indices: one call per
-- Redis node, and one argument however many shards); an index is due when its lowest score is
-- at most now - lag_ms, as take_due counts it. Reads only. -> the 0-based positions of the due
-- pairs.
local now = now_ms()
local due = {}
local position = 0
for key, lag_ms in string.gmatch(A.indices, '(%S+) (%S+)') do
  local lowest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if lowest[2] and tonumber(lowest[2]) <= now - tonumber(lag_ms) then
    due[#due + 1] = position
  end
  position = position + 1
end
return due
