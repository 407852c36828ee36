-- A worker's heartbeat, stamped with the server's clock: {at, received, slots} under its name.
redis.call('HSET', K.workers, A.name, '{"at":' .. now_ms() .. ',"received":' .. A.received ..
  ',"slots":' .. tonumber(A.slots) .. '}')
return 1
