-- A running turn failed with a resumable error: keep its checkpoint (in place of its frames),
-- release the lease and wait in the retry index until due. -> the due time (server epoch ms),
-- or 0 when the lease is no longer this turn's.
local turn_id, error = A.turn_id, A.error
local delay_ms = tonumber(A.delay_ms)

if not holds_lease(K.lease, turn_id, A.token) then return 0 end
local now = now_ms()
local due = now + delay_ms
-- An attempt that streamed (tokens.lua marked it): its deltas of the iteration in flight are
-- void, since the next attempt asks the model again. Said first, under the failed attempt.
if redis.call('HDEL', K.turn, F.streamed) == 1 then
  emit(K.events, K.turn, now, EVENT.ATTEMPT_DISCARDED,
    {attempt = tonumber(redis.call('HGET', K.turn, F.attempt) or '1')})
end
emit(K.events, K.turn, now, EVENT.RETRY_SCHEDULED, {dueAt = due, error = error})
-- The journal stays: the next attempt continues the iteration in flight from it.
set_checkpoint(K.turn, A.checkpoint)
redis.call('HSET', K.turn, F.state, STATE.WAITING, F.due_at_ms, due, F.attempt, A.next_attempt,
  F.deliveries, 0, F.last_error, error, F.updated_at_ms, now)
redis.call('HSETNX', K.turn, F.first_failed_at_ms, now)
redis.call('HDEL', K.turn, F.token)
redis.call('ZADD', K.retries, due, turn_id)
count(K.turn, COUNTER.RETRIES_SCHEDULED)
redis.call('DEL', K.lease)
redis.call('ZREM', K.running, turn_id)
gate_release_of(K.turn, turn_id)  -- not running: its tenant's count goes down
return due
