-- renew many: KEYS state, live of each lease in turn; ARGV ttl_ms, then
-- holder, token of each lease.
-- One reply of renew's per lease, in order.
local out = {}
for i = 1, #KEYS / 2 do
  out[i] = renew(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i], ARGV[2 * i + 1], ARGV[1])
end
return out
