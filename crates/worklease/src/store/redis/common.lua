-- worklease: shared by every script (prepended to each at compile time).
--
-- The keys of one work ID share one hash slot (a hash tag of the escaped
-- work ID) and are passed in this order, each script taking a prefix of
-- the list or the ones it names:
--   state  a hash: holder, token, ttl, phase (held | released | revoked),
--          exp (server ms of expiry or of the end), prev_holder,
--          prev_token, prev_end; never expires
--   live   a string with a PX TTL: it exists exactly while the lease is
--          live by the server's clock
--   ckpt   the checkpoint bytes; never expires
--   fence  the fencing counter (INCR); never expires
-- Work IDs, holder IDs and data only ever arrive as KEYS and ARGV.

-- The server's clock in whole milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integral Lua number as a decimal string (never in exponent form).
local function dec(n)
  return string.format('%d', n)
end

-- a > b for canonical decimal strings (no sign, no leading zeros): exact
-- at any size, where Lua's numbers (doubles) are not.
local function dec_gt(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end

-- nil when holder + token name the current, live acquisition of the work
-- ID; otherwise why not: 'fenced' (taken over, revoked or never issued) or
-- 'expired' (current, but expired or released).
local function check(state, live, holder, token)
  local st = redis.call('HMGET', state, 'holder', 'token', 'phase')
  if st[1] ~= holder or st[2] ~= token then
    return 'fenced'
  end
  if st[3] == 'released' then
    return 'expired'
  end
  if st[3] ~= 'held' then
    return 'fenced'
  end
  if redis.call('EXISTS', live) == 0 then
    return 'expired'
  end
  return nil
end

-- Everything `status` shows of one work ID, or nil when it has no state:
-- holder, token, ttl, phase, exp, prev_holder, prev_token, prev_end,
-- PTTL of live, checkpoint length, server now (ms).
local function info(state, live, ckpt)
  local st = redis.call('HMGET', state, 'holder', 'token', 'ttl', 'phase', 'exp',
    'prev_holder', 'prev_token', 'prev_end')
  if not st[1] or not st[2] then
    return nil
  end
  return {st[1], st[2], st[3], st[4], st[5], st[6], st[7], st[8],
    redis.call('PTTL', live), redis.call('STRLEN', ckpt), dec(now_ms())}
end

