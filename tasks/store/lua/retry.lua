-- A running turn failed with a resumable error: keep its checkpoint (in place of its frames), release the lease and
-- wait in the retry index until due. -> the due time (server epoch ms), or 0 when the lease is
-- no longer this turn's.
local turn_key, lease_key, running_key, retries_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, token, delay_ms, next_attempt, checkpoint, error =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]

if not holds_lease(lease_key, turn_id, token) then return 0 end
local now = now_ms()
local due = now + delay_ms
emit(events_key, turn_key, now, 'retry.scheduled', {dueAt = due, error = error})
-- The journal stays: the next attempt continues the iteration in flight from it.
set_checkpoint(turn_key, checkpoint)
redis.call('HSET', turn_key, 'state', 'waiting', 'due_at_ms', due, 'attempt', next_attempt,
  'deliveries', 0, 'last_error', error, 'updated_at_ms', now)
redis.call('HSETNX', turn_key, 'first_failed_at_ms', now)
redis.call('HDEL', turn_key, 'token')
redis.call('ZADD', retries_key, due, turn_id)
count(turn_key, 'retries_scheduled')
redis.call('DEL', lease_key)
redis.call('ZREM', running_key, turn_id)
return due
