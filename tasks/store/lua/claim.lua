-- Take a turn if it may run now: not ended, not waiting out a backoff, the head of its
-- conversation's queue, no live lease. -> {claimed, deliveries, record, stored envelope or
-- false, its conversation frames, the held turns the fairness gate released for the worker
-- to publish} or {refusal}: missing | done | paused | not_due | not_head | capped | busy.
local turn_id, token, worker = A.turn_id, A.token, A.worker
local lease_ms = tonumber(A.lease_ms)

-- What the claim decides by, in one read.
local at = redis.call('HMGET', K.turn, F.state, F.due_at_ms, F.handed_over, F.deliveries,
  F.redeliveries, F.attempt, F.iteration, F.tenant, F.namespace, F.agent, F.conversation_id)
local state = at[1]
local gate = A.gate
local now = now_ms()
local refusal = nil
if not state then
  refusal = R.MISSING
elseif is_terminal(state) then
  refusal = R.DONE
elseif state == STATE.PAUSED then
  -- A paused turn waits for a person: only a decision (decide.lua) makes it runnable.
  refusal = R.PAUSED
elseif state == STATE.WAITING and tonumber(at[2]) > now then
  refusal = R.NOT_DUE
elseif redis.call('LINDEX', K.queue, 0) ~= turn_id then
  refusal = R.NOT_HEAD
elseif gate ~= '' and gate_hold_capped(gate, A.gate_cfg,
    cjson.encode({K.turn, K.pending, turn_id, at[9] or '', at[10] or '', at[11] or '',
      tonumber(at[6] or '1')}),
    K.turn, turn_id, at[8] or '') then
  -- Its tenant is at its running cap: held for the gate (common.lua, gate_hold_capped).
  refusal = R.CAPPED
elseif not redis.call('SET', K.lease, lease_value(turn_id, token), 'PX', lease_ms, 'NX') then
  refusal = R.BUSY
end
if refusal then
  -- A message the fairness gate admitted was used up all the same, and a turn that does not
  -- run now stops counting in flight (busy: another delivery runs it).
  if gate ~= '' then
    redis.call('ZREM', gate .. ':unclaimed', turn_id)
    -- (busy and running: the other delivery runs it, and it counts; busy and not running: a
    -- lease left behind, and nothing runs it)
    if state and (refusal ~= R.BUSY or state ~= STATE.RUNNING) then
      gate_release_of(K.turn, turn_id)
    end
  end
  return {refusal}
end

-- Still running with no lease: its worker stopped renewing (died, stalled, lost Redis), and
-- this claim takes the turn over.
if state == STATE.RUNNING then count(K.turn, COUNTER.LEASE_TAKEOVERS) end
-- A start after a handover (handover.lua) goes on with the delivery that handed it over: only
-- starts after a crash count toward `poison`.
local deliveries = tonumber(at[4] or '0')
local fields = {F.state, STATE.RUNNING, F.token, token, F.worker, worker, F.started_at_ms, now,
  F.updated_at_ms, now}
if at[3] then
  -- (a wait for a budget, wait.lua, sets handed_over too, with what it waited for)
  redis.call('HDEL', K.turn, F.handed_over, F.waiting_for)
else
  deliveries = deliveries + 1
  fields[#fields + 1] = F.deliveries
  fields[#fields + 1] = deliveries
  if deliveries > 1 then
    fields[#fields + 1] = F.redeliveries
    fields[#fields + 1] = tonumber(at[5] or '0') + 1
  end
end
redis.call('HSET', K.turn, unpack(fields))
redis.call('ZREM', K.retries, turn_id)
redis.call('ZREM', K.pending, turn_id)
redis.call('ZADD', K.running, now + lease_ms, turn_id)
emit_as(K.events, now, at[6] or '1', at[7] or '0', EVENT.TURN_STARTED, {worker = worker})
-- The stored conversation (its envelope and the frames on it, tasks/store/conversations.py)
-- comes back with the claim when the turn starts from it; nobody else writes it while this
-- turn holds the head of the queue and the lease.
local stored, frames = false, {}
if redis.call('HEXISTS', K.turn, F.checkpoint) == 0 then
  stored = redis.call('GET', K.conversation)
  if stored then frames = redis.call('LRANGE', K.conversation_frames, 0, -1) end
end
-- Tenant fairness: this turn counts in flight now (admitted, or started without the gate), and
-- its place in the broker's queue goes to the next held turn in weighted round-robin.
local released = {}
if gate ~= '' then
  redis.call('ZREM', gate .. ':unclaimed', turn_id)
  gate_count(gate, K.turn, turn_id, at[8] or '')
  released = gate_fill(gate, A.gate_cfg, now, 4)
end
return {R.CLAIMED, deliveries, redis.call('HGETALL', K.turn), stored, frames, released}
