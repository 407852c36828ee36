-- Record a submitted turn and queue it behind its conversation's earlier turns, with its
-- deadline (deadline_ms from now by the server's clock; 0 for none) and the trace context its
-- attempts join (tasks/telemetry.py; '' for none).
-- -> 1 when recorded; 0 when this turn id was already recorded with the same payload (a
-- resubmission: left as it is); -1 when it was recorded with another payload (refused).
local turn_key, queue_key, pending_key, events_key, deadlines_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, payload, agent, conversation_id, namespace, checkpoint, replay_of, deadline_ms =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
local trace = ARGV[9] or ''

local existing = redis.call('HGET', turn_key, 'payload')
if existing then
  if existing == payload then return 0 end
  return -1
end
local now = now_ms()
redis.call('HSET', turn_key, 'state', 'queued', 'payload', payload, 'agent', agent,
  'conversation_id', conversation_id, 'namespace', namespace, 'attempt', 1, 'deliveries', 0,
  'created_at_ms', now, 'updated_at_ms', now)
if checkpoint ~= '' then redis.call('HSET', turn_key, 'checkpoint', checkpoint) end
if replay_of ~= '' then redis.call('HSET', turn_key, 'replay_of', replay_of) end
if trace ~= '' then redis.call('HSET', turn_key, 'trace', trace) end
if deadline_ms > 0 then
  redis.call('HSET', turn_key, 'deadline_at_ms', now + deadline_ms)
  redis.call('ZADD', deadlines_key, now + deadline_ms, turn_id)
end
-- A payload too broken to name a conversation queues nowhere: its worker dead-letters it.
if namespace ~= '' and redis.call('RPUSH', queue_key, turn_id) == 1 then
  mark_runnable(turn_key, now)
end
redis.call('ZADD', pending_key, now, turn_id)
count(turn_key, 'submitted')
emit(events_key, turn_key, now, 'turn.queued', {agent = agent, conversationId = conversation_id})
return 1
