-- Write the journal of a running turn's iteration in flight (tasks/journal.py): field/value
-- pairs, and with an event type, that event in the same step (tool.started, tool.finished).
-- -> 1, or 0 for a stale worker (it stops: the turn is someone else's now).
local turn_key, lease_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local turn_id, token, event_type, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if not holds_lease(lease_key, turn_id, token) then return 0 end
if #ARGV > 4 then redis.call('HSET', turn_key, unpack(ARGV, 5)) end
if event_type ~= '' then emit(events_key, turn_key, now_ms(), event_type, cjson.decode(data)) end
return 1
