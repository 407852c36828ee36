-- Undo register for a turn whose message could not be published. -> 1 when removed.
local turn_id = A.turn_id

if redis.call('HGET', K.turn, F.state) ~= STATE.QUEUED then return 0 end
redis.call('DEL', K.turn, K.events)
count(K.turn, COUNTER.SUBMITTED, -1)  -- never submitted after all
redis.call('LREM', K.queue, 1, turn_id)
redis.call('ZREM', K.pending, turn_id)
redis.call('ZREM', K.deadlines, turn_id)
redis.call('ZREM', K.submitted, turn_id)
return 1
