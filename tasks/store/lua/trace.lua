-- Keep the trace context a turn's attempts join (tasks/telemetry.py) when its submitter had
-- none: the first attempt's own, written once and fenced by the lease, so a later attempt, a
-- takeover or a handover joins the same trace. -> the context kept (this one, or one written
-- before), or false when the lease is no longer this turn's.
local turn_key, lease_key = KEYS[1], KEYS[2]
local turn_id, token, trace = ARGV[1], ARGV[2], ARGV[3]

if not holds_lease(lease_key, turn_id, token) then return false end
redis.call('HSETNX', turn_key, 'trace', trace)
return redis.call('HGET', turn_key, 'trace')
