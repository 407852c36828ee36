-- Append a running turn's streamed answer text to its stream: one token.delta event, `data`
-- its JSON {text} (the worker's coalesced writes, tasks/turn/tokens.py). -> 1, or 0 for a
-- stale worker (it writes no more: the turn is someone else's now).
--
-- The record keeps who streamed last, F.streamed = '<iteration>|<lease token>', for two
-- things. retry.lua reads it: an attempt that streamed ends with attempt.discarded. And when
-- another delivery of the same attempt streams the same iteration again (its predecessor died
-- mid-reply and the model is asked again), attempt.discarded goes first here, so a reader drops
-- that iteration's earlier deltas. A new delivery that streams a later iteration (after a
-- handover, or a takeover that went on from the journal) voids nothing: those deltas stand.
-- Each new mark also enters the turn in its shard's token index, looked at check_ms later by
-- the pump (drop_tokens.lua).
if not holds_lease(K.lease, A.turn_id, A.token) then return 0 end
local now = now_ms()
local at = redis.call('HMGET', K.turn, F.attempt, F.iteration, F.streamed)
local iteration = at[2] or '0'
local mark = iteration .. '|' .. A.token
if at[3] ~= mark then
  if at[3] and string.match(at[3], '^[^|]*') == iteration then
    emit(K.events, K.turn, now, EVENT.ATTEMPT_DISCARDED, {attempt = tonumber(at[1] or '1')})
  end
  redis.call('HSET', K.turn, F.streamed, mark)
  redis.call('ZADD', K.tokens, 'NX', now + tonumber(A.check_ms), A.turn_id)
end
emit_json(K.events, K.turn, now, EVENT.TOKEN_DELTA, A.data)
return 1
