-- File a dead-letter entry and end the turn as dead_lettered, atomically. The entry summary
-- goes to the shard's store; the record keeps the payload and the last checkpoint, and stays
-- (no expiry) while the entry does. token '' is for a turn that was never claimed.
-- -> {ok, next head or false} | {done} (already ended) | {lost} (lease not held)
local turn_id, token, entry_id, reason, checkpoint = A.turn_id, A.token, A.entry_id, A.reason,
  A.checkpoint

if is_terminal(redis.call('HGET', K.turn, F.state)) then return {R.DONE} end
if token ~= '' and not holds_lease(K.lease, turn_id, token) then return {R.LOST} end
local now = now_ms()
if checkpoint ~= '' then set_checkpoint(K.turn, checkpoint) end
-- The failure times are the server's: the entry summary gets them here.
local first = redis.call('HGET', K.turn, F.first_failed_at_ms) or tostring(now)
local summary = cjson.decode(A.entry)
summary['firstFailedAtMs'] = tonumber(first)
summary['lastFailedAtMs'] = now
redis.call('HSET', K.dead_letters, entry_id, cjson.encode(summary))
redis.call('ZADD', K.dead_letter_index, now, entry_id)
local head = end_turn(K, A.turn_prefix, turn_id, STATE.DEAD_LETTERED, now,
  {F.dlq_id, entry_id, F.reason, reason}, EVENT.TURN_DEAD_LETTERED,
  {reason = reason, entryId = entry_id})
redis.call('PERSIST', K.turn)
redis.call('PERSIST', K.events)
return {R.OK, head}
