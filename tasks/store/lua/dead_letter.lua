-- File a dead-letter entry and end the turn as dead_lettered, atomically. The entry summary
-- goes to the shard's store; the record keeps the payload and the last checkpoint, and stays
-- (no expiry) while the entry does. token '' is for a turn that was never claimed.
-- -> {'ok', next head or false} | {'done'} (already ended) | {'lost'} (lease not held)
local k = ending_keys()
local dlq_key, dlq_index_key = KEYS[12], KEYS[13]
local turn_id, token, entry_id, entry, reason, checkpoint, turn_prefix =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
k.turn_prefix = turn_prefix

if is_terminal(redis.call('HGET', k.turn, 'state')) then return {'done'} end
if token ~= '' and not holds_lease(k.lease, turn_id, token) then return {'lost'} end
local now = now_ms()
if checkpoint ~= '' then set_checkpoint(k.turn, checkpoint) end
-- The failure times are the server's: the entry summary gets them here.
local first = redis.call('HGET', k.turn, 'first_failed_at_ms') or tostring(now)
local summary = cjson.decode(entry)
summary['firstFailedAtMs'] = tonumber(first)
summary['lastFailedAtMs'] = now
redis.call('HSET', dlq_key, entry_id, cjson.encode(summary))
redis.call('ZADD', dlq_index_key, now, entry_id)
local head = end_turn(k, turn_id, 'dead_lettered', now, {'dlq_id', entry_id, 'reason', reason},
  'turn.dead_lettered', {reason = reason, entryId = entry_id})
redis.call('PERSIST', k.turn)
redis.call('PERSIST', k.events)
return {'ok', head}
