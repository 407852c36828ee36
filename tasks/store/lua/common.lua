-- Shared by every script (tasks/store/records.py puts it in front of each). The one place that
-- encodes a lease and reads the server's clock (docs/operations.md, "Scale out": leases, due
-- times and deadlines come from the Redis server's clock, not a worker's).
--
-- Before it comes the prelude generated from tasks/core/schema.py (lua_prelude): STATE,
-- TERMINAL, EVENT, F (record fields), FP (field prefixes), EF (event stream fields), COUNTER,
-- and the script's own R (replies), K (KEYS by name), A (ARGV by name) and REST. Names only:
-- no state, event, field or reply is spelled as a string here or in a script.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function lease_value(turn_id, token)
  return turn_id .. '|' .. token
end

-- True when the conversation lease is this turn's under this token: every write of a running
-- turn checks it, so a worker that stalled past its lease cannot write over its successor.
local function holds_lease(lease_key, turn_id, token)
  return redis.call('GET', lease_key) == lease_value(turn_id, token)
end

-- The turn id holding a lease, or false.
local function lease_holder(lease_key)
  local value = redis.call('GET', lease_key)
  if not value then return false end
  return string.match(value, '^(.*)|[^|]*$')
end

local function is_terminal(state)
  return TERMINAL[state] == true
end

-- Count one thing a script did in its shard's counters hash (tasks/core/keys.py,
-- ShardKeys.counters), in the same step as the change it counts. The hash is named from any
-- turn key of the shard ('{prefix}:{<shard>}:turn:<id>', the prefix has no braces): one slot
-- with the keys the script holds, and no script's KEYS change for it.
local function count(turn_key, name, by)
  redis.call('HINCRBY', string.match(turn_key, '^(.-}):turn:') .. ':counters', name, by or 1)
end

-- When a queued turn became runnable (the head of its conversation, nothing running ahead of
-- it): `agentjobs metrics` reports the oldest such turn's age (tasks/operate/inspect.py).
local function mark_runnable(turn_key, now)
  if redis.call('EXISTS', turn_key) == 1 then
    redis.call('HSET', turn_key, F.runnable_at_ms, now)
  end
end

-- A turn's progress frames (tasks/store/progress.py): fields frame:1 .. frame:<frames>.
local function add_frame(turn_key, frame)
  local n = redis.call('HINCRBY', turn_key, F.frames, 1)
  redis.call('HSET', turn_key, FP.frame .. n, frame)
end

local function clear_frames(turn_key)
  local n = tonumber(redis.call('HGET', turn_key, F.frames) or '0')
  for i = 1, n do redis.call('HDEL', turn_key, FP.frame .. i) end
  redis.call('HDEL', turn_key, F.frames, F.base, F.base_frames)
end

-- Replace a turn's progress with a whole checkpoint (a retry's, a dead letter's).
local function set_checkpoint(turn_key, checkpoint)
  clear_frames(turn_key)
  redis.call('HSET', turn_key, F.checkpoint, checkpoint)
end

-- Frames that build on the stored conversation keep a copy of it once the turn ends, since
-- the conversation moves on with the next turn: its envelope, and its conversation frames as
-- one JSON array (each frame is a JSON object).
local function keep_base(turn_key, conversation_key, frames_key)
  if redis.call('HEXISTS', turn_key, F.frames) == 0 then return end
  if redis.call('HEXISTS', turn_key, F.checkpoint) == 1 then return end
  local stored = redis.call('GET', conversation_key)
  if not stored then return end
  redis.call('HSET', turn_key, F.base, stored)
  local frames = redis.call('LRANGE', frames_key, 0, -1)
  if #frames > 0 then
    redis.call('HSET', turn_key, F.base_frames, '[' .. table.concat(frames, ',') .. ']')
  end
end

-- The journal of the iteration in flight (tasks/store/journal.py): journal:response and
-- journal:<index> for each call that started, journal:calls holding how many calls it has.
-- journal:requests (a pause's requests, JSON) and journal:request_ids belong to it too.
local function clear_journal(turn_key)
  local n = tonumber(redis.call('HGET', turn_key, F.journal_calls) or '0')
  for i = 0, n - 1 do redis.call('HDEL', turn_key, FP.journal .. i) end
  redis.call('HDEL', turn_key, F.journal_response, F.journal_calls, F.journal_requests,
    F.journal_request_ids)
end

-- Append one event to a turn's stream, in the same step as the record change it reports
-- (docs/operations.md, "Events"). `data_json` is a JSON object; `emit` takes a table.
local function emit_json_as(events_key, now, attempt, iteration, event_type, data_json)
  redis.call('XADD', events_key, '*', EF.type, event_type, EF.attempt, attempt,
    EF.iteration, iteration, EF.at, now, EF.data, data_json)
end

local function emit_json(events_key, turn_key, now, event_type, data_json)
  local at = redis.call('HMGET', turn_key, F.attempt, F.iteration)
  emit_json_as(events_key, now, at[1] or '1', at[2] or '0', event_type, data_json)
end

local function emit(events_key, turn_key, now, event_type, data)
  emit_json(events_key, turn_key, now, event_type, cjson.encode(data))
end

-- emit, for a script that knows the turn's attempt and iteration already.
local function emit_as(events_key, now, attempt, iteration, event_type, data)
  emit_json_as(events_key, now, attempt, iteration, event_type, cjson.encode(data))
end

-- End a turn: mark it `state` with `fields`, drop it from every live index, release its lease
-- (when it held it), take it off its conversation's queue, write its terminal event and mark
-- the next head as woken now. `k` holds the keys of schema.ENDING_KEYS by name (the script's
-- K); `turn_prefix` names the next head's record. Returns the next head's turn id and agent,
-- or false. The one place a turn ends, so the one place endings are counted.
-- `held`: the caller checked that the turn holds its conversation's lease (succeed.lua), so
-- the lease is dropped without reading it again. Every live index is cleaned whatever the
-- state implies: an entry left there would wake an ended turn at every sweep. `stored`: the
-- caller wrote the turn's Celery result in this step, so the pump has nothing to confirm.
local function end_turn(k, turn_prefix, turn_id, state, now, fields, event_type, event_data,
    held, stored)
  redis.call('HSET', k.turn, F.state, state, F.finished_at_ms, now, F.updated_at_ms, now,
    unpack(fields))
  count(k.turn, COUNTER.FINISHED .. state)
  if state == STATE.DEAD_LETTERED then
    count(k.turn, COUNTER.DEAD_LETTERED .. (redis.call('HGET', k.turn, F.reason) or ''))
  end
  clear_journal(k.turn)
  keep_base(k.turn, k.conversation, k.conversation_frames)
  emit(k.events, k.turn, now, event_type, event_data)
  redis.call('HDEL', k.turn, F.token)
  if held or lease_holder(k.lease) == turn_id then redis.call('DEL', k.lease) end
  redis.call('ZREM', k.running, turn_id)
  redis.call('ZREM', k.retries, turn_id)
  redis.call('ZREM', k.pending, turn_id)
  redis.call('ZREM', k.deadlines, turn_id)
  redis.call('ZREM', k.pauses, turn_id)
  if not stored then redis.call('ZADD', k.finished, now, turn_id) end
  redis.call('LREM', k.queue, 1, turn_id)
  local head = redis.call('LINDEX', k.queue, 0)
  if not head then return false end
  redis.call('ZADD', k.pending, 'XX', now, head)
  mark_runnable(turn_prefix .. head, now)
  return {head, redis.call('HGET', turn_prefix .. head, F.agent) or ''}
end
