-- A worker's heartbeat, stamped with the server's clock: {at, received} under its name.
redis.call('HSET', K.workers, A.name, '{"at":' .. now_ms() .. ',"received":' .. A.received .. '}')
return 1
