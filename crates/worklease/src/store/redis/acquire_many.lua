-- acquire many: KEYS state, live, fence of each work ID in turn;
-- ARGV holder, ttl_ms, max.
-- Tries the work IDs in order, as acquire does each, and stops once max
-- are granted: one reply of acquire's per work ID tried.
local max = tonumber(ARGV[3])
local out, granted = {}, 0
for i = 1, #KEYS / 3 do
  if granted >= max then
    break
  end
  local r = acquire(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[1], ARGV[2])
  if r[1] == 'ok' then
    granted = granted + 1
  end
  out[i] = r
end
return out
