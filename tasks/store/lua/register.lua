-- Record a submitted turn and queue it behind its conversation's earlier turns, with its
-- deadline (deadline_ms from now by the server's clock; 0 for none) and the trace context its
-- attempts join (tasks/telemetry/tracing.py; '' for none).
-- -> created (1) when recorded; exists (0) when this turn id was already recorded with the
-- same payload (a resubmission: left as it is); conflict (-1) when it was recorded with
-- another payload (refused).
local turn_id, payload, agent, conversation_id, namespace = A.turn_id, A.payload, A.agent,
  A.conversation_id, A.namespace
local deadline_ms = tonumber(A.deadline_ms)
local trace = A.trace or ''

local existing = redis.call('HGET', K.turn, F.payload)
if existing then
  if existing == payload then return R.EXISTS end
  return R.CONFLICT
end
local now = now_ms()
redis.call('HSET', K.turn, F.state, STATE.QUEUED, F.payload, payload, F.agent, agent,
  F.conversation_id, conversation_id, F.namespace, namespace, F.attempt, 1, F.deliveries, 0,
  F.created_at_ms, now, F.updated_at_ms, now)
if A.checkpoint ~= '' then redis.call('HSET', K.turn, F.checkpoint, A.checkpoint) end
if A.replay_of ~= '' then redis.call('HSET', K.turn, F.replay_of, A.replay_of) end
if trace ~= '' then redis.call('HSET', K.turn, F.trace, trace) end
if deadline_ms > 0 then
  redis.call('HSET', K.turn, F.deadline_at_ms, now + deadline_ms)
  redis.call('ZADD', K.deadlines, now + deadline_ms, turn_id)
end
-- A payload too broken to name a conversation queues nowhere: its worker dead-letters it.
if namespace ~= '' and redis.call('RPUSH', K.queue, turn_id) == 1 then
  mark_runnable(K.turn, now)
end
redis.call('ZADD', K.pending, now, turn_id)
count(K.turn, COUNTER.SUBMITTED)
emit(K.events, K.turn, now, EVENT.TURN_QUEUED, {agent = agent, conversationId = conversation_id})
return R.CREATED
