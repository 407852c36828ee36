-- A worker that is shutting down (a deploy) hands a running turn over: the lease is released
-- at once, so another worker claims the turn now rather than a lease later; the turn is queued
-- again at the head of its conversation with its last persisted checkpoint, and the claim that
-- takes it up continues this delivery instead of counting a new one (a deploy must not push a
-- turn toward `poison`). Fenced by the lease token.
-- -> {ok, agent, conversation_id} | {lost} (the lease is no longer this turn's)
local turn_id = A.turn_id

if not holds_lease(K.lease, turn_id, A.token) then return {R.LOST} end
local now = now_ms()
redis.call('HSET', K.turn, F.state, STATE.QUEUED, F.handed_over, 1, F.updated_at_ms, now)
redis.call('HINCRBY', K.turn, F.handovers, 1)
mark_runnable(K.turn, now)
count(K.turn, COUNTER.HANDOVERS)
redis.call('HDEL', K.turn, F.token)
redis.call('DEL', K.lease)
redis.call('ZREM', K.running, turn_id)
-- Should its wake-up be lost, the pump wakes a queued head that nobody started.
redis.call('ZADD', K.pending, now, turn_id)
emit(K.events, K.turn, now, EVENT.TURN_HANDED_OVER, {worker = A.worker, reason = A.reason})
local named = redis.call('HMGET', K.turn, F.agent, F.conversation_id)
return {R.OK, named[1] or '', named[2] or ''}
