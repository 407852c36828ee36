-- Write the journal of a running turn's iteration in flight (tasks/store/journal.py):
-- field/value pairs (from REST on), and with an event type, that event in the same step
-- (tool.started, tool.finished). -> 1, or 0 for a stale worker (it stops: the turn is someone
-- else's now).
if not holds_lease(K.lease, A.turn_id, A.token) then return 0 end
if #ARGV >= REST then redis.call('HSET', K.turn, unpack(ARGV, REST)) end
if A.event_type ~= '' then
  emit_json(K.events, K.turn, now_ms(), A.event_type, A.event_data)
end
return 1
