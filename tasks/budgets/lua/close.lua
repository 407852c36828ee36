-- A provider's 429 with retry-after: the budget admits nothing until then (a later close wins).
-- KEYS: closed. ARGV: for how many ms. -> until when (server epoch ms)
local until_ms = now_ms() + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current >= until_ms then return current end
redis.call('SET', KEYS[1], until_ms, 'PX', tonumber(ARGV[1]))
return until_ms
