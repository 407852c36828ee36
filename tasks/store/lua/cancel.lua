-- Cancel an unfinished turn, whatever its state: it ends as cancelled at once, its lease (if it
-- held it), retry and queue place released, the next turn woken. A worker still running it is
-- fenced out: its next write finds no lease. -> {'ok', next head or false} | {'done'}
local k = ending_keys()
local turn_id, reason, ttl_s, turn_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
k.turn_prefix = turn_prefix

local state = redis.call('HGET', k.turn, 'state')
if not state or is_terminal(state) then return {'done'} end
local head = end_turn(k, turn_id, 'cancelled', now_ms(), {'cancel_reason', reason},
  'turn.cancelled', {reason = reason})
redis.call('EXPIRE', k.turn, ttl_s)
redis.call('EXPIRE', k.events, ttl_s)
return {'ok', head}
