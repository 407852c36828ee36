-- A running turn's next model call cannot start yet: a provider budget is spent (or closed by
-- a 429), or its tenant reached its token cap. Release the lease and wait in the retry index
-- until `due_at_ms`, as last persisted and without counting an attempt or a delivery (the next
-- claim goes on as after a handover). -> the due time (server epoch ms), or 0 when the lease
-- is no longer this turn's.
local turn_id = A.turn_id
if not holds_lease(K.lease, turn_id, A.token) then return 0 end
local now = now_ms()
local due = math.max(tonumber(A.due_at_ms), now)
emit(K.events, K.turn, now, EVENT.BUDGET_WAITING,
  {waitingFor = A.waiting_for, budget = A.budget, limit = A.limit, dueAt = due})
redis.call('HSET', K.turn, F.state, STATE.WAITING, F.due_at_ms, due, F.waiting_for,
  A.waiting_for, F.handed_over, 1, F.updated_at_ms, now)
redis.call('HDEL', K.turn, F.token)
redis.call('ZADD', K.retries, due, turn_id)
count(K.turn, COUNTER.BUDGET_WAITS .. A.budget)
redis.call('DEL', K.lease)
redis.call('ZREM', K.running, turn_id)
gate_release_of(K.turn, turn_id)  -- not running: its tenant's count goes down
return due
