-- inspect: KEYS state, live, ckpt. Reads only.
-- {'none'} | {'ok', info}
local i = info(KEYS[1], KEYS[2], KEYS[3])
if not i then
  return {'none'}
end
return {'ok', i}
