-- acquire: KEYS state, live, fence; ARGV holder, ttl_ms.
-- {'held', holder, pttl} | {'ok', token, prev_holder, prev_token, prev_end}
local pttl = redis.call('PTTL', KEYS[2])
if pttl ~= -2 then
  -- Live for everyone, the same holder ID included (ADR 0002).
  return {'held', redis.call('HGET', KEYS[1], 'holder'), pttl}
end
local st = redis.call('HMGET', KEYS[1], 'holder', 'token', 'phase')
redis.call('INCR', KEYS[3])
local token = redis.call('GET', KEYS[3])
if st[2] and not dec_gt(token, st[2]) then
  -- The counter was deleted or set back: go on after the state's token.
  redis.call('SET', KEYS[3], st[2])
  redis.call('INCR', KEYS[3])
  token = redis.call('GET', KEYS[3])
end
local ended = false
if st[1] and st[2] then
  ended = 'expired'
  if st[3] == 'released' or st[3] == 'revoked' then
    ended = st[3]
  end
  redis.call('HSET', KEYS[1], 'prev_holder', st[1], 'prev_token', st[2], 'prev_end', ended)
else
  redis.call('HDEL', KEYS[1], 'prev_holder', 'prev_token', 'prev_end')
end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'ttl', ARGV[2],
  'phase', 'held', 'exp', dec(now_ms() + tonumber(ARGV[2])))
redis.call('SET', KEYS[2], token, 'PX', ARGV[2])
return {'ok', token, st[1] or false, st[2] or false, ended}
