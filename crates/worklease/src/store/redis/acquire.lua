-- acquire: KEYS state, live, fence; ARGV holder, ttl_ms.
-- {'held', holder, pttl} | {'ok', token, prev_holder, prev_token, prev_end}
return acquire(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
