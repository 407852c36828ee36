-- Renew a running turn's lease; with a frame, also persist its progress (tasks/progress.py),
-- and when the frame ends an iteration, drop that iteration's journal with it.
-- -> 1, or 0 when the lease is no longer this turn's under this token (a stale worker).
local turn_key, lease_key, running_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local turn_id, token, lease_ms, frame, iteration, ends_iteration =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]

if not holds_lease(lease_key, turn_id, token) then return 0 end
local now = now_ms()
redis.call('PEXPIRE', lease_key, lease_ms)
redis.call('ZADD', running_key, now + lease_ms, turn_id)
if frame then
  add_frame(turn_key, frame)
  if ends_iteration == '1' then clear_journal(turn_key) end
  redis.call('HSET', turn_key, 'iteration', iteration, 'updated_at_ms', now)
  emit(events_key, turn_key, now, 'iteration.persisted', {})
end
return 1
