-- release many: KEYS state, live of each lease in turn; ARGV channel, then
-- holder, token, work ID of each lease.
-- Releases each as release does (and publishes each released work ID):
-- one reply of release's per lease, in order.
local out = {}
for i = 1, #KEYS / 2 do
  out[i] = finish(KEYS[2 * i - 1], KEYS[2 * i], ARGV[3 * i - 1], ARGV[3 * i],
    'released', ARGV[1], ARGV[3 * i + 1])
end
return out
