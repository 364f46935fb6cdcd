-- abandon: KEYS state, live of each acquisition in turn; ARGV holder,
-- channel, then token, work ID of each acquisition.
-- Ends acquisitions their caller will not use (too few replicas
-- acknowledged them) as if they had expired: the next holder sees no
-- clean hand-off. One reply per acquisition: {'ok'} | {'fenced'} | {'expired'}
local out = {}
for i = 1, #KEYS / 2 do
  out[i] = finish(KEYS[2 * i - 1], KEYS[2 * i], ARGV[1], ARGV[2 * i + 1], nil,
    ARGV[2], ARGV[2 * i + 2])
end
return out
