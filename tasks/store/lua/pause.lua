-- A running turn waits for a person (docs/operations.md, "People in the loop"): keep its
-- progress and its paused iteration, release the lease and the worker, hold its place at the
-- head of the conversation, and stop its deadline's clock until it resumes.
-- ARGV: turn_id, token, ttl_ms, frame, requests (JSON, shown as they are), request count n,
-- then n pairs (request id, kind), then journal field/value pairs (the response, when no call
-- of it had started). -> the pause's expiry (server epoch ms), or 0 for a stale worker.
local turn_key, lease_key, running_key, events_key, deadlines_key, pauses_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local turn_id, token, ttl_ms, frame, requests, n =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])

if not holds_lease(lease_key, turn_id, token) then return 0 end
local now = now_ms()
local expires = now + ttl_ms
if frame ~= '' then add_frame(turn_key, frame) end
local ids = {}
for i = 0, n - 1 do
  local request_id, kind = ARGV[7 + 2 * i], ARGV[8 + 2 * i]
  redis.call('HSET', turn_key, 'request:' .. request_id, kind)
  ids[#ids + 1] = request_id
end
local rest = 7 + 2 * n
if #ARGV >= rest then redis.call('HSET', turn_key, unpack(ARGV, rest)) end
redis.call('HSET', turn_key, 'state', 'paused', 'handed_over', 1, 'journal:requests', requests,
  'journal:request_ids', table.concat(ids, ' '), 'paused_at_ms', now,
  'pause_expires_at_ms', expires, 'updated_at_ms', now)
-- (handed_over: the claim after the pause continues this delivery; a pause is no crash.)
-- Time paused does not count toward the deadline: keep what is left of it.
local deadline = redis.call('ZSCORE', deadlines_key, turn_id)
if deadline then
  redis.call('HSET', turn_key, 'deadline_left_ms', math.max(0, tonumber(deadline) - now))
  redis.call('ZREM', deadlines_key, turn_id)
end
redis.call('HDEL', turn_key, 'token')
redis.call('DEL', lease_key)
redis.call('ZREM', running_key, turn_id)
redis.call('ZADD', pauses_key, expires, turn_id)
count(turn_key, 'pauses')
emit_json(events_key, turn_key, now, 'turn.paused', '{"pending":' .. requests .. '}')
return expires
