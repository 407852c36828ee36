-- Cancel an unfinished turn, whatever its state: it ends as cancelled at once, its lease (if it
-- held it), retry and queue place released, the next turn woken. A worker still running it is
-- fenced out: its next write finds no lease. -> {ok, next head or false} | {done}
local state = redis.call('HGET', K.turn, F.state)
if not state or is_terminal(state) then return {R.DONE} end
local head = end_turn(K, A.turn_prefix, A.turn_id, STATE.CANCELLED, now_ms(),
  {F.cancel_reason, A.reason}, EVENT.TURN_CANCELLED, {reason = A.reason})
redis.call('EXPIRE', K.turn, A.ttl_s)
redis.call('EXPIRE', K.events, A.ttl_s)
return {R.OK, head}
