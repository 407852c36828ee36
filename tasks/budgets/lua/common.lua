-- Shared by the ledger scripts (tasks/budgets/ledger.py puts it in front of each). A ledger is
-- one limit or more, each a log of settled calls (call id -> settle time), the amount each call
-- counts and their running total; reservations not settled yet count in the total and the
-- amounts, and sit in `holds` until settled or expired (docs/platform.md, "Budgets and
-- fairness"). Every time is the Redis server's clock, in ms.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- At most this many ids per command: unpack() has a stack limit.
local CHUNK = 500

-- Settled calls of one limit that are a window old leave it, and their amounts its total.
-- -> the total after.
local function prune(log, amounts, total, window_ms, now)
  local cutoff = now - window_ms
  while true do
    local old = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff, 'LIMIT', 0, CHUNK)
    if #old == 0 then break end
    local freed = 0
    for _, amount in ipairs(redis.call('HMGET', amounts, unpack(old))) do
      freed = freed + (tonumber(amount) or 0)
    end
    redis.call('HDEL', amounts, unpack(old))
    redis.call('ZREM', log, unpack(old))
    redis.call('DECRBY', total, freed)
  end
  return tonumber(redis.call('GET', total) or '0')
end

-- When the total has fallen by `excess` through settled calls leaving the window, or false
-- when the settled calls alone cannot free that much (reservations hold the rest).
local function frees_at(log, amounts, window_ms, excess)
  local freed, start = 0, 0
  while true do
    local entries = redis.call('ZRANGE', log, start, start + CHUNK - 1, 'WITHSCORES')
    if #entries == 0 then return false end
    local ids = {}
    for i = 1, #entries, 2 do ids[#ids + 1] = entries[i] end
    local found = redis.call('HMGET', amounts, unpack(ids))
    for i = 1, #ids do
      freed = freed + (tonumber(found[i]) or 0)
      if freed >= excess then return tonumber(entries[2 * i]) + window_ms + 1 end
    end
    start = start + CHUNK
  end
end

-- Keep a ledger key a while after its last write: the longest window, then an hour.
local function keep(key, ms)
  redis.call('PEXPIRE', key, ms)
end
