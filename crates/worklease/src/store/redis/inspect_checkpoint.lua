-- inspect_checkpoint: KEYS state, live, ckpt. Reads only.
-- {'none'} | {'ok', info, checkpoint bytes or false}
local i = info(KEYS[1], KEYS[2], KEYS[3])
if not i then
  return {'none'}
end
return {'ok', i, redis.call('GET', KEYS[3])}
