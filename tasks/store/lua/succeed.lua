-- Store the conversation and end the turn as succeeded, atomically. The record keeps its
-- result, not its checkpoint (the stored conversation holds it).
-- -> {'ok', next head or false} or {'lost'} (the lease is no longer this turn's).
local k = ending_keys()
local turn_id, token, envelope, result, ttl_s, turn_prefix =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
k.turn_prefix = turn_prefix

if not holds_lease(k.lease, turn_id, token) then return {'lost'} end
redis.call('SET', k.conversation, envelope)
clear_frames(k.turn)
redis.call('HDEL', k.turn, 'checkpoint')
local content = cjson.decode(result)['content']
local head = end_turn(k, turn_id, 'succeeded', now_ms(), {'result', result}, 'turn.succeeded',
  {content = content})
redis.call('EXPIRE', k.turn, ttl_s)
redis.call('EXPIRE', k.events, ttl_s)
return {'ok', head}
