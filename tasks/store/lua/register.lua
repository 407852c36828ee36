-- Record a submitted turn and queue it behind its conversation's earlier turns, with its
-- deadline (deadline_ms from now by the server's clock; 0 for none) and the trace context its
-- attempts join (tasks/telemetry/tracing.py; '' for none). With A.message, a new turn's
-- message is pushed onto the broker's list in the same step (the broker is this Redis:
-- tasks/queue/broker.py, PublishFold); a turn the fairness gate holds gets none yet.
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
local fields = {F.state, STATE.QUEUED, F.payload, payload, F.agent, agent,
  F.conversation_id, conversation_id, F.namespace, namespace, F.attempt, 1, F.deliveries, 0,
  F.created_at_ms, now, F.updated_at_ms, now}
-- The optional fields, as (name, value) pairs; a false value is left out.
local optional = {F.checkpoint, A.checkpoint ~= '' and A.checkpoint, F.replay_of,
  A.replay_of ~= '' and A.replay_of, F.trace, trace ~= '' and trace,
  F.deadline_at_ms, deadline_ms > 0 and now + deadline_ms}
for i = 1, #optional, 2 do
  if optional[i + 1] then
    fields[#fields + 1] = optional[i]
    fields[#fields + 1] = optional[i + 1]
  end
end
if deadline_ms > 0 then redis.call('ZADD', K.deadlines, now + deadline_ms, turn_id) end
-- A payload too broken to name a conversation queues nowhere: its worker dead-letters it.
-- The first turn of its queue is runnable at once (mark_runnable, written with the rest).
if namespace ~= '' and redis.call('RPUSH', K.queue, turn_id) == 1 then
  fields[#fields + 1] = F.runnable_at_ms
  fields[#fields + 1] = now
end
if A.tenant ~= '' then
  fields[#fields + 1] = F.tenant
  fields[#fields + 1] = A.tenant
end
redis.call('HSET', K.turn, unpack(fields))
redis.call('ZADD', K.pending, now, turn_id)
redis.call('ZADD', K.submitted, now, turn_id)
count(K.turn, COUNTER.SUBMITTED)
-- A new record's attempt is 1 and its iteration unset: the event needs no read of them.
emit_as(K.events, now, 1, 0, EVENT.TURN_QUEUED, {agent = agent, conversationId = conversation_id})
-- Tenant fairness: published now, or held until the gate releases it (common.lua, gate_admit).
if A.gate ~= '' and namespace ~= '' then
  local ref = cjson.encode({K.turn, K.pending, turn_id, namespace, agent, conversation_id})
  if not gate_admit(A.gate, A.gate_cfg, ref, K.turn, K.pending, turn_id, A.tenant, now) then
    return R.HELD
  end
end
if A.message ~= '' then redis.call('LPUSH', K.broker_queue, A.message) end
return R.CREATED
