-- A worker that is shutting down (a deploy) hands a running turn over: the lease is released
-- at once, so another worker claims the turn now rather than a lease later; the turn is queued
-- again at the head of its conversation with its last persisted checkpoint, and the claim that
-- takes it up continues this delivery instead of counting a new one (a deploy must not push a
-- turn toward `poison`). Fenced by the lease token.
-- -> {'ok', agent, conversation_id} | {'lost'} (the lease is no longer this turn's)
local turn_key, lease_key, running_key, pending_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, token, worker, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if not holds_lease(lease_key, turn_id, token) then return {'lost'} end
local now = now_ms()
redis.call('HSET', turn_key, 'state', 'queued', 'handed_over', 1, 'updated_at_ms', now)
redis.call('HINCRBY', turn_key, 'handovers', 1)
mark_runnable(turn_key, now)
count(turn_key, 'handovers')
redis.call('HDEL', turn_key, 'token')
redis.call('DEL', lease_key)
redis.call('ZREM', running_key, turn_id)
-- Should its wake-up be lost, the pump wakes a queued head that nobody started.
redis.call('ZADD', pending_key, now, turn_id)
emit(events_key, turn_key, now, 'turn.handed_over', {worker = worker, reason = reason})
local named = redis.call('HMGET', turn_key, 'agent', 'conversation_id')
return {'ok', named[1] or '', named[2] or ''}
