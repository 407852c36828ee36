-- A worker's heartbeat, stamped with the server's clock: {at, received} under its name.
local workers_key = KEYS[1]
local name, received = ARGV[1], ARGV[2]

redis.call('HSET', workers_key, name, '{"at":' .. now_ms() .. ',"received":' .. received .. '}')
return 1
