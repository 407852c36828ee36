-- The pump's fill of the fairness gate (common.lua, gate_fill): held turns admitted where the
-- claims left room, or a tenant's running cap now does. -> the refs admitted, to publish
return gate_fill(A.gate, A.gate_cfg, now_ms(), tonumber(A.limit))
