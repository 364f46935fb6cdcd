-- abandon: KEYS state, live; ARGV holder, token, channel, work ID.
-- Ends an acquisition its caller will not use (too few replicas
-- acknowledged it) as if it had expired: the next holder sees no clean
-- hand-off. {'ok'} | {'fenced'} | {'expired'}
local bad = check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if bad then
  return {bad}
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'exp', dec(now_ms()))
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {'ok'}
