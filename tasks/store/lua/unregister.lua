-- Undo register for a turn whose message could not be published. -> 1 when removed.
local turn_key, queue_key, pending_key, events_key, deadlines_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id = ARGV[1]

if redis.call('HGET', turn_key, 'state') ~= 'queued' then return 0 end
redis.call('DEL', turn_key, events_key)
count(turn_key, 'submitted', -1)  -- never submitted after all
redis.call('LREM', queue_key, 1, turn_id)
redis.call('ZREM', pending_key, turn_id)
redis.call('ZREM', deadlines_key, turn_id)
return 1
