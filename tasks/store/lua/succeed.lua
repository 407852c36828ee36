-- Store the conversation and end the turn as succeeded, atomically, with its Celery result
-- when given. The record keeps its result, not its checkpoint (the stored conversation holds it).
-- The conversation is either written whole (A.envelope: a compaction, its frames dropped) or
-- has the turn's frame appended (A.frame), as the worker chose (tasks/store/conversations.py).
-- -> {ok, next head or false} or {lost} (the lease is no longer this turn's).
if not holds_lease(K.lease, A.turn_id, A.token) then return {R.LOST} end
-- Celery's result, as its Redis backend writes it (SET with the results' expiry, then PUBLISH
-- on the key's channel for a waiting result.get()), when the backend is this Redis: first, so
-- that a refused write leaves the turn as it was.
if A.celery_meta ~= '' then
  local ttl_s = tonumber(A.celery_ttl_s)
  if ttl_s > 0 then
    redis.call('SET', K.celery_result, A.celery_meta, 'EX', ttl_s)
  else
    redis.call('SET', K.celery_result, A.celery_meta)
  end
  redis.call('PUBLISH', K.celery_result, A.celery_meta)
end
if A.envelope ~= '' then
  redis.call('SET', K.conversation, A.envelope)
  redis.call('DEL', K.conversation_frames)
else
  redis.call('RPUSH', K.conversation_frames, A.frame)
end
clear_frames(K.turn, F.checkpoint)
local content = cjson.decode(A.result)['content']
local now = now_ms()
if A.usage then add_usage(K.turn, A.usage, now) end
local head = end_turn(K, A.turn_prefix, A.turn_id, STATE.SUCCEEDED, now, {F.result, A.result},
  EVENT.TURN_SUCCEEDED, {content = content}, true, A.celery_meta ~= '')
redis.call('EXPIRE', K.turn, A.ttl_s)
redis.call('EXPIRE', K.events, A.ttl_s)
return {R.OK, head}
