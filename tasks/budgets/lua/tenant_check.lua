-- Whether a tenant may start another model call: its reported usage in the window is below its
-- cap. KEYS: log, amounts, total. ARGV: cap, window ms.
-- -> {1, used} below the cap | {0, used, due ms} at or over it, until `due`
local cap, window_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local used = prune(KEYS[1], KEYS[2], KEYS[3], window_ms, now)
if used < cap then return {1, used} end
local due = frees_at(KEYS[1], KEYS[2], window_ms, used - cap + 1) or (now + window_ms)
return {0, used, due}
