-- Store the conversation and end the turn as succeeded, atomically. The record keeps its
-- result, not its checkpoint (the stored conversation holds it).
-- -> {ok, next head or false} or {lost} (the lease is no longer this turn's).
if not holds_lease(K.lease, A.turn_id, A.token) then return {R.LOST} end
redis.call('SET', K.conversation, A.envelope)
clear_frames(K.turn)
redis.call('HDEL', K.turn, F.checkpoint)
local content = cjson.decode(A.result)['content']
local head = end_turn(K, A.turn_prefix, A.turn_id, STATE.SUCCEEDED, now_ms(), {F.result, A.result},
  EVENT.TURN_SUCCEEDED, {content = content})
redis.call('EXPIRE', K.turn, A.ttl_s)
redis.call('EXPIRE', K.events, A.ttl_s)
return {R.OK, head}
