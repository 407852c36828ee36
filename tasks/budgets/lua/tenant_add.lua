-- Count a model call's reported tokens toward its tenant's cap, once per call.
-- KEYS: log, amounts, total. ARGV: call id, tokens, keep ms. -> 1 counted, 0 counted already
local now = now_ms()
if redis.call('ZADD', KEYS[1], 'NX', now, ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('INCRBY', KEYS[3], ARGV[2])
for _, k in ipairs(KEYS) do keep(k, tonumber(ARGV[3])) end
return 1
