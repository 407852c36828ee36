-- Take a turn if it may run now: not ended, not waiting out a backoff, the head of its
-- conversation's queue, no live lease. -> {'claimed', deliveries, record, stored envelope or
-- false} or {refusal}: missing | done | paused | not_due | not_head | busy.
local turn_key, queue_key, lease_key, retries_key, running_key, pending_key, conversation_key,
  events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local turn_id, token, lease_ms, worker = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local state = redis.call('HGET', turn_key, 'state')
if not state then return {'missing'} end
if is_terminal(state) then return {'done'} end
-- A paused turn waits for a person: only a decision (tasks/lua/decide.lua) makes it runnable.
if state == 'paused' then return {'paused'} end
local now = now_ms()
if state == 'waiting' and tonumber(redis.call('HGET', turn_key, 'due_at_ms')) > now then
  return {'not_due'}
end
if redis.call('LINDEX', queue_key, 0) ~= turn_id then return {'not_head'} end
if redis.call('EXISTS', lease_key) == 1 then return {'busy'} end

redis.call('SET', lease_key, lease_value(turn_id, token), 'PX', lease_ms)
-- Still `running` with no lease: its worker stopped renewing (died, stalled, lost Redis), and
-- this claim takes the turn over.
if state == 'running' then count(turn_key, 'lease_takeovers') end
-- A start after a handover (handover.lua) goes on with the delivery that handed it over: only
-- starts after a crash count toward `poison`.
local deliveries
if redis.call('HDEL', turn_key, 'handed_over') == 1 then
  deliveries = tonumber(redis.call('HGET', turn_key, 'deliveries'))
else
  deliveries = redis.call('HINCRBY', turn_key, 'deliveries', 1)
  if deliveries > 1 then redis.call('HINCRBY', turn_key, 'redeliveries', 1) end
end
redis.call('HSET', turn_key, 'state', 'running', 'token', token, 'worker', worker,
  'started_at_ms', now, 'updated_at_ms', now)
redis.call('ZREM', retries_key, turn_id)
redis.call('ZREM', pending_key, turn_id)
redis.call('ZADD', running_key, now + lease_ms, turn_id)
emit(events_key, turn_key, now, 'turn.started', {worker = worker})
-- The stored conversation comes back with the claim when the turn starts from it; nobody
-- else writes it while this turn holds the head of the queue and the lease.
local stored = false
if redis.call('HEXISTS', turn_key, 'checkpoint') == 0 then
  stored = redis.call('GET', conversation_key)
end
return {'claimed', deliveries, redis.call('HGETALL', turn_key), stored}
