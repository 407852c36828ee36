-- The tokens a turn's attempt reported, when the script that ends it does not take them (a
-- retry, a pause, a dead letter): add_usage (common.lua) in its shard. -> 1
add_usage(K.turn, A.usage, now_ms())
return 1
