-- revoke: KEYS state, live, ckpt; ARGV channel, work ID.
-- An operator's forced release of whoever holds the lease.
-- {'none'} | {'ok', info as before}
local before = info(KEYS[1], KEYS[2], KEYS[3])
if not before then
  return {'none'}
end
if before[4] == 'held' and before[9] ~= -2 then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'phase', 'revoked', 'exp', dec(now_ms()))
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return {'ok', before}
