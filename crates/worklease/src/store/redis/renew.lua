-- renew: KEYS state, live; ARGV holder, token, ttl_ms.
-- {'ok'} | {'fenced'} | {'expired'}
local bad = check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if bad then
  return {bad}
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'ttl', ARGV[3], 'exp', dec(now_ms() + tonumber(ARGV[3])))
return {'ok'}
