-- read checkpoint: KEYS state, live, ckpt; ARGV holder, token.
-- {'ok', data|nil, prev_holder|nil, prev_token|nil, prev_end|nil} | {'fenced'} | {'expired'}
local bad = check(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if bad then
  return {bad}
end
local prev = redis.call('HMGET', KEYS[1], 'prev_holder', 'prev_token', 'prev_end')
return {'ok', redis.call('GET', KEYS[3]), prev[1], prev[2], prev[3]}
