-- Keep the trace context a turn's attempts join (tasks/telemetry/tracing.py) when its
-- submitter had none: the first attempt's own, written once and fenced by the lease, so a later
-- attempt, a takeover or a handover joins the same trace. -> the context kept (this one, or one
-- written before), or false when the lease is no longer this turn's.
if not holds_lease(K.lease, A.turn_id, A.token) then return false end
redis.call('HSETNX', K.turn, F.trace, A.trace)
return redis.call('HGET', K.turn, F.trace)
