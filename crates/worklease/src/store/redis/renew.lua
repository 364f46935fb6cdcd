-- renew: KEYS state, live; ARGV holder, token, ttl_ms.
-- {'ok'} | {'fenced'} | {'expired'}
return renew(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
