-- checkpoint: KEYS state, live, ckpt; ARGV holder, token, ttl_ms, data.
-- Stores the data and extends the lease in one step (ADR 0003).
-- {'ok'} | {'fenced'} | {'expired'}
local bad = check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if bad then
  return {bad}
end
redis.call('SET', KEYS[3], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'ttl', ARGV[3], 'exp', dec(now_ms() + tonumber(ARGV[3])))
return {'ok'}
