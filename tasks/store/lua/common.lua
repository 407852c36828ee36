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

-- Tokens a turn's model calls reported (tasks/budgets/usage.py, usage_json): a JSON object
-- {bucketMs, ttlS, rows: [[usage field, counter field, tokens], ...]}. Each row adds to the
-- shard's usage hash of the span of bucketMs that holds `now` (named from the turn key, as
-- `count` names the counters) and to the shard's counters.
local function add_usage(turn_key, usage_json, now)
  local usage = cjson.decode(usage_json)
  if #usage.rows == 0 then return end
  local tag = string.match(turn_key, '^(.-}):turn:')
  local bucket = tag .. ':usage:' .. math.floor(now / usage.bucketMs)
  for _, row in ipairs(usage.rows) do
    redis.call('HINCRBY', bucket, row[1], row[3])
    redis.call('HINCRBY', tag .. ':counters', row[2], row[3])
  end
  redis.call('EXPIRE', bucket, usage.ttlS)
end

-- Tenant fairness (tasks/turn/fairness.py; docs/platform.md, "Budgets and fairness"). The gate
-- keeps the broker's queue about as deep as the workers have slots: a turn submitted while that
-- many are published and unclaimed, or whose tenant is at its running cap or has turns held
-- already, is held in its tenant's list instead of published; each claim frees a place, filled
-- from the held tenants in smooth weighted round-robin. `g` is the gate's key tag (keys.py,
-- FairKeys): g:unclaimed (zset turn -> admitted at), g:owners (hash turn -> tenant),
-- g:keys (hash turn -> its record's key), g:inflight (hash tenant -> turns admitted or
-- running), g:active (hash tenant -> its current
-- weight, for each tenant with held turns), g:held:<tenant> (list of refs), g:window (the
-- slots, written by the pump). A ref is [turn key, pending key, turn id, namespace, agent,
-- conversation id]. The gate's keys are in no shard's slot: it runs on one Redis (or a
-- Sentinel group's master), and is off on a Cluster.
-- {weights = {tenant = w}, dw = default weight, caps = {tenant = n}, dc = default cap or -1}
local function gate_config(cfg_json)
  return cjson.decode(cfg_json)
end

-- Until the pump has counted the workers' slots, 16.
local function gate_window(g)
  return tonumber(redis.call('GET', g .. ':window') or '16')
end

local function gate_under_cap(g, cfg, tenant)
  local cap = tonumber(cfg.caps[tenant] or cfg.dc)
  return cap < 0 or tonumber(redis.call('HGET', g .. ':inflight', tenant) or '0') < cap
end

-- Count a turn in flight (admitted, or started without the gate: a retry, the next turn of a
-- conversation), once.
local function gate_count(g, turn_key, turn_id, tenant)
  redis.call('HSET', turn_key, F.gate, g)
  if redis.call('HSETNX', g .. ':owners', turn_id, tenant) == 1 then
    redis.call('HINCRBY', g .. ':inflight', tenant, 1)
    redis.call('HSET', g .. ':keys', turn_id, turn_key)
  end
end

-- The turn stopped running (it ended, waits or is paused): its tenant's count goes down.
local function gate_release(g, turn_id)
  redis.call('ZREM', g .. ':unclaimed', turn_id)
  local tenant = redis.call('HGET', g .. ':owners', turn_id)
  if not tenant then return end
  redis.call('HDEL', g .. ':owners', turn_id)
  redis.call('HDEL', g .. ':keys', turn_id)
  if redis.call('HINCRBY', g .. ':inflight', tenant, -1) <= 0 then
    redis.call('HDEL', g .. ':inflight', tenant)
  end
end

local function gate_release_of(turn_key, turn_id)
  local g = redis.call('HGET', turn_key, F.gate)
  if not g then return end
  redis.call('HDEL', turn_key, F.gate)
  gate_release(g, turn_id)
end

-- At submission: true when the turn may be published now, false when it was held.
local function gate_admit(g, cfg_json, ref, turn_key, pending_key, turn_id, tenant, now)
  local cfg = gate_config(cfg_json)
  if redis.call('HEXISTS', g .. ':active', tenant) == 0
      and redis.call('ZCARD', g .. ':unclaimed') < gate_window(g)
      and gate_under_cap(g, cfg, tenant) then
    redis.call('ZADD', g .. ':unclaimed', now, turn_id)
    gate_count(g, turn_key, turn_id, tenant)
    return true
  end
  redis.call('RPUSH', g .. ':held:' .. tenant, ref)
  redis.call('HSETNX', g .. ':active', tenant, 0)
  -- Not runnable while held: the pump's stall sweep must not start it behind the gate's back.
  redis.call('ZREM', pending_key, turn_id)
  return false
end

-- Admit held turns while the window has room, in smooth weighted round-robin over the tenants
-- with held turns that are under their cap: each round every such tenant gains its weight, the
-- one with the most goes and pays back the round's total. -> the refs admitted (at most limit)
local function gate_fill(g, cfg_json, now, limit)
  local admitted = {}
  local raw = redis.call('HGETALL', g .. ':active')
  if #raw == 0 then return admitted end
  local room = gate_window(g) - redis.call('ZCARD', g .. ':unclaimed')
  if room <= 0 then return admitted end
  local cfg = gate_config(cfg_json)
  local current, tenants = {}, {}
  for i = 1, #raw, 2 do
    tenants[#tenants + 1] = raw[i]
    current[raw[i]] = tonumber(raw[i + 1])
  end
  local picks = 0
  while room > 0 and #admitted < limit and picks < limit * 4 do
    picks = picks + 1
    local total, best = 0, nil
    for _, tenant in ipairs(tenants) do
      if current[tenant] ~= nil and gate_under_cap(g, cfg, tenant) then
        local weight = tonumber(cfg.weights[tenant] or cfg.dw)
        current[tenant] = current[tenant] + weight
        total = total + weight
        if best == nil or current[tenant] > current[best] then best = tenant end
      end
    end
    if best == nil then break end
    current[best] = current[best] - total
    local held = g .. ':held:' .. best
    local ref = redis.call('LPOP', held)
    if redis.call('LLEN', held) == 0 then
      current[best] = nil
      redis.call('HDEL', g .. ':active', best)
    end
    if ref then
      local r = cjson.decode(ref)
      -- A turn cancelled while held, or counted meanwhile (started without the window), is
      -- left out; a waiting one is a retry held at its claim (gate_hold_capped). Whether it
      -- counts is the owners hash's to say: a record's gate field can outlive its count.
      local held_state = redis.call('HGET', r[1], F.state)
      if (held_state == STATE.QUEUED or held_state == STATE.WAITING) and
          redis.call('HEXISTS', g .. ':owners', r[3]) == 0 then
        redis.call('ZADD', g .. ':unclaimed', now, r[3])
        gate_count(g, r[1], r[3], best)
        if held_state == STATE.QUEUED then redis.call('ZADD', r[2], now, r[3]) end
        admitted[#admitted + 1] = ref
        room = room - 1
      end
    end
  end
  for _, tenant in ipairs(tenants) do
    if current[tenant] ~= nil then redis.call('HSET', g .. ':active', tenant, current[tenant]) end
  end
  return admitted
end

-- A claim of a turn not counted in flight (a retry, the next turn of a conversation, a decided
-- pause: none came through gate_admit) whose tenant is at its running cap: the turn is held in
-- its tenant's list until gate_fill admits it as a place frees, rather than run over the cap. `ref` as gate_admit's, with the attempt. -> true when held.
local function gate_hold_capped(g, cfg_json, ref, turn_key, turn_id, tenant)
  if redis.call('HEXISTS', g .. ':owners', turn_id) == 1 then return false end
  if gate_under_cap(g, gate_config(cfg_json), tenant) then return false end
  redis.call('HDEL', turn_key, F.gate)
  redis.call('RPUSH', g .. ':held:' .. tenant, ref)
  redis.call('HSETNX', g .. ':active', tenant, 0)
  -- It stays in the pump's indices: should the gate never get to it, the pump wakes it again
  -- (a stalled queued turn, a due retry) and its claim decides again.
  return true
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

local function clear_frames(turn_key, ...)
  local fields = {F.frames, F.base, F.base_frames, ...}
  for i = 1, tonumber(redis.call('HGET', turn_key, F.frames) or '0') do
    fields[#fields + 1] = FP.frame .. i
  end
  redis.call('HDEL', turn_key, unpack(fields))
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
local function clear_journal(turn_key, ...)
  local fields = {F.journal_response, F.journal_calls, F.journal_requests, F.journal_request_ids,
    ...}
  for i = 0, tonumber(redis.call('HGET', turn_key, F.journal_calls) or '0') - 1 do
    fields[#fields + 1] = FP.journal .. i
  end
  redis.call('HDEL', turn_key, unpack(fields))
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
  clear_journal(k.turn, F.token)
  gate_release_of(k.turn, turn_id)
  keep_base(k.turn, k.conversation, k.conversation_frames)
  emit(k.events, k.turn, now, event_type, event_data)
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
