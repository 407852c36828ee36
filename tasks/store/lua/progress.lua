-- Renew a running turn's lease; with a frame, also persist its progress
-- (tasks/store/progress.py), and when the frame ends an iteration, drop that iteration's
-- journal with it; the tool.finished events of calls whose outcome only the frame holds come
-- from REST on. -> 1, or 0 when the lease is no longer this turn's under this token (a stale
-- worker).
local turn_id, frame = A.turn_id, A.frame
local lease_ms = tonumber(A.lease_ms)

if not holds_lease(K.lease, turn_id, A.token) then return 0 end
local now = now_ms()
redis.call('PEXPIRE', K.lease, lease_ms)
redis.call('ZADD', K.running, now + lease_ms, turn_id)
if frame then
  add_frame(K.turn, frame)
  if A.ends_iteration == '1' then clear_journal(K.turn) end
  -- Calls whose outcome only this frame holds: their events, under the iteration that ran
  -- them (before the record moves on to the next); then the persisted one, under the new.
  local at = redis.call('HMGET', K.turn, F.attempt, F.iteration)
  local attempt = at[1] or '1'
  for i = REST, #ARGV do
    emit_json_as(K.events, now, attempt, at[2] or '0', EVENT.TOOL_FINISHED, ARGV[i])
  end
  redis.call('HSET', K.turn, F.iteration, A.iteration, F.updated_at_ms, now)
  emit_as(K.events, now, attempt, A.iteration, EVENT.ITERATION_PERSISTED, {})
end
return 1
