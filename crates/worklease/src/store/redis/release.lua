-- release: KEYS state, live; ARGV holder, token, channel, work ID.
-- Ends the lease at once, marks it released, wakes waiters.
-- {'ok'} | {'fenced'} | {'expired'}
local bad = check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if bad then
  return {bad}
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'phase', 'released', 'exp', dec(now_ms()))
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {'ok'}
