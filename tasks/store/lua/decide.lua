-- Record a person's decision on a request of a paused turn; once every request of the pause
-- is decided, the turn resumes: queued again at the head of its conversation, its deadline's
-- clock running again. The decision body is compared as bytes, so deciding twice the same way
-- is harmless whoever decides.
-- -> {'recorded'} | {'resumed', agent, conversation_id} | {'same'} | {'conflict'} |
--    {'kind', request kind} | {'unknown'} (never pending) | {'ended', state} | {'missing'}
local turn_key, events_key, deadlines_key, pauses_key, pending_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, request_id, decision, body, actor, event =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

local state = redis.call('HGET', turn_key, 'state')
if not state then return {'missing'} end
local kind = redis.call('HGET', turn_key, 'request:' .. request_id)
if not kind then return {'unknown'} end
local existing = redis.call('HGET', turn_key, 'decision:' .. request_id)
if existing then
  if existing == body then return {'same'} end
  return {'conflict'}
end
if state ~= 'paused' then return {'ended', state} end
if (decision == 'approve' and kind ~= 'approval') or (decision == 'answer' and kind ~= 'question') then
  return {'kind', kind}
end
local now = now_ms()
redis.call('HSET', turn_key, 'decision:' .. request_id, body, 'decided_by:' .. request_id, actor,
  'updated_at_ms', now)
emit_json(events_key, turn_key, now, 'action.decided', event)
local ids = redis.call('HGET', turn_key, 'journal:request_ids') or ''
for id in string.gmatch(ids, '%S+') do
  if redis.call('HEXISTS', turn_key, 'decision:' .. id) == 0 then return {'recorded'} end
end
redis.call('HSET', turn_key, 'state', 'queued')
redis.call('HDEL', turn_key, 'paused_at_ms', 'pause_expires_at_ms')
redis.call('ZREM', pauses_key, turn_id)
local left = redis.call('HGET', turn_key, 'deadline_left_ms')
if left then
  local deadline = now + tonumber(left)
  redis.call('HSET', turn_key, 'deadline_at_ms', deadline)
  redis.call('HDEL', turn_key, 'deadline_left_ms')
  redis.call('ZADD', deadlines_key, deadline, turn_id)
end
redis.call('ZADD', pending_key, now, turn_id)
mark_runnable(turn_key, now)
emit(events_key, turn_key, now, 'turn.resumed', {})
local named = redis.call('HMGET', turn_key, 'agent', 'conversation_id')
return {'resumed', named[1] or '', named[2] or ''}
