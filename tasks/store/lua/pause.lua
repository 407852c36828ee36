-- A running turn waits for a person (docs/operations.md, "People in the loop"): keep its
-- progress and its paused iteration, release the lease and the worker, hold its place at the
-- head of the conversation, and stop its deadline's clock until it resumes.
-- ARGV: the named ones (A), then from REST on request_count pairs (request id, kind), then
-- journal field/value pairs (the response, when no call of it had started).
-- -> the pause's expiry (server epoch ms), or 0 for a stale worker.
local turn_id, frame, requests = A.turn_id, A.frame, A.requests
local ttl_ms, n = tonumber(A.ttl_ms), tonumber(A.request_count)

if not holds_lease(K.lease, turn_id, A.token) then return 0 end
local now = now_ms()
local expires = now + ttl_ms
if frame ~= '' then add_frame(K.turn, frame) end
local ids = {}
for i = 0, n - 1 do
  local request_id, kind = ARGV[REST + 2 * i], ARGV[REST + 1 + 2 * i]
  redis.call('HSET', K.turn, FP.request .. request_id, kind)
  ids[#ids + 1] = request_id
end
local journal_from = REST + 2 * n
if #ARGV >= journal_from then redis.call('HSET', K.turn, unpack(ARGV, journal_from)) end
redis.call('HSET', K.turn, F.state, STATE.PAUSED, F.handed_over, 1, F.journal_requests, requests,
  F.journal_request_ids, table.concat(ids, ' '), F.paused_at_ms, now,
  F.pause_expires_at_ms, expires, F.updated_at_ms, now)
-- (handed_over: the claim after the pause continues this delivery; a pause is no crash.)
-- Time paused does not count toward the deadline: keep what is left of it.
local deadline = redis.call('ZSCORE', K.deadlines, turn_id)
if deadline then
  redis.call('HSET', K.turn, F.deadline_left_ms, math.max(0, tonumber(deadline) - now))
  redis.call('ZREM', K.deadlines, turn_id)
end
redis.call('HDEL', K.turn, F.token)
redis.call('DEL', K.lease)
redis.call('ZREM', K.running, turn_id)
gate_release_of(K.turn, turn_id)  -- not running: its tenant's count goes down
redis.call('ZADD', K.pauses, expires, turn_id)
count(K.turn, COUNTER.PAUSES)
emit_json(K.events, K.turn, now, EVENT.TURN_PAUSED, '{"pending":' .. requests .. '}')
return expires
