-- Record a person's decision on a request of a paused turn; once every request of the pause
-- is decided, the turn resumes: queued again at the head of its conversation, its deadline's
-- clock running again. The decision body is compared as bytes, so deciding twice the same way
-- is harmless whoever decides.
-- -> {recorded} | {resumed, agent, conversation_id} | {same} | {conflict} |
--    {kind, request kind} | {unknown} (never pending) | {ended, state} | {missing}
local turn_id, request_id, decision, body = A.turn_id, A.request_id, A.decision, A.body

local state = redis.call('HGET', K.turn, F.state)
if not state then return {R.MISSING} end
local kind = redis.call('HGET', K.turn, FP.request .. request_id)
if not kind then return {R.UNKNOWN} end
local existing = redis.call('HGET', K.turn, FP.decision .. request_id)
if existing then
  if existing == body then return {R.SAME} end
  return {R.CONFLICT}
end
if state ~= STATE.PAUSED then return {R.ENDED, state} end
-- The decisions and request kinds are tasks/operate/people.py's (agent/pauses.py's kinds).
if (decision == 'approve' and kind ~= 'approval') or (decision == 'answer' and kind ~= 'question') then
  return {R.KIND, kind}
end
local now = now_ms()
redis.call('HSET', K.turn, FP.decision .. request_id, body, FP.decided_by .. request_id, A.actor,
  F.updated_at_ms, now)
emit_json(K.events, K.turn, now, EVENT.ACTION_DECIDED, A.event)
local ids = redis.call('HGET', K.turn, F.journal_request_ids) or ''
for id in string.gmatch(ids, '%S+') do
  if redis.call('HEXISTS', K.turn, FP.decision .. id) == 0 then return {R.RECORDED} end
end
redis.call('HSET', K.turn, F.state, STATE.QUEUED)
redis.call('HDEL', K.turn, F.paused_at_ms, F.pause_expires_at_ms)
redis.call('ZREM', K.pauses, turn_id)
local left = redis.call('HGET', K.turn, F.deadline_left_ms)
if left then
  local deadline = now + tonumber(left)
  redis.call('HSET', K.turn, F.deadline_at_ms, deadline)
  redis.call('HDEL', K.turn, F.deadline_left_ms)
  redis.call('ZADD', K.deadlines, deadline, turn_id)
end
redis.call('ZADD', K.pending, now, turn_id)
mark_runnable(K.turn, now)
emit(K.events, K.turn, now, EVENT.TURN_RESUMED, {})
local named = redis.call('HMGET', K.turn, F.agent, F.conversation_id)
return {R.RESUMED, named[1] or '', named[2] or ''}
