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
--
-- The operations that have a batch form (acquire, renew, release,
-- abandon) are functions here, called by the single script with its KEYS
-- and ARGV and by the batch script once per lease; each returns the
-- lease's reply in the single script's encoding.

-- The server's clock in whole milliseconds, read once per script call: a
-- batch is one instant, as it is for key expiry (which Redis judges by the
-- script's start).
local now_cache
local function now_ms()
  if not now_cache then
    local t = redis.call('TIME')
    now_cache = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_cache
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

-- nil when holder + token name the current acquisition of the work ID
-- and it is held (its live key not yet looked at); otherwise why not:
-- 'fenced' (taken over, revoked or never issued) or 'expired' (released).
local function check_state(state, holder, token)
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
  return nil
end

-- nil when holder + token name the current, live acquisition of the work
-- ID; otherwise why not: 'fenced' (taken over, revoked or never issued) or
-- 'expired' (current, but expired or released).
local function check(state, live, holder, token)
  local bad = check_state(state, holder, token)
  if bad then
    return bad
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


-- Acquires the work ID (keys state, live, fence) for holder for ttl ms
-- unless a lease is live.
-- {'held', holder, pttl} | {'ok', token, prev_holder, prev_token, prev_end}
local function acquire(state, live, fence, holder, ttl)
  local pttl = redis.call('PTTL', live)
  if pttl ~= -2 then
    -- Live for everyone, the same holder ID included (ADR 0002).
    return {'held', redis.call('HGET', state, 'holder'), pttl}
  end
  local st = redis.call('HMGET', state, 'holder', 'token', 'phase')
  redis.call('INCR', fence)
  local token = redis.call('GET', fence)
  if st[2] and not dec_gt(token, st[2]) then
    -- The counter was deleted or set back: go on after the state's token.
    redis.call('SET', fence, st[2])
    redis.call('INCR', fence)
    token = redis.call('GET', fence)
  end
  local ended = false
  local exp = dec(now_ms() + tonumber(ttl))
  if st[1] and st[2] then
    ended = 'expired'
    if st[3] == 'released' or st[3] == 'revoked' then
      ended = st[3]
    end
    redis.call('HSET', state, 'holder', holder, 'token', token, 'ttl', ttl,
      'phase', 'held', 'exp', exp, 'prev_holder', st[1], 'prev_token', st[2], 'prev_end', ended)
  else
    redis.call('HDEL', state, 'prev_holder', 'prev_token', 'prev_end')
    redis.call('HSET', state, 'holder', holder, 'token', token, 'ttl', ttl,
      'phase', 'held', 'exp', exp)
  end
  redis.call('SET', live, token, 'PX', ttl)
  return {'ok', token, st[1] or false, st[2] or false, ended}
end

-- Extends the lease (keys state, live) of holder + token to ttl ms from
-- now. {'ok'} | {'fenced'} | {'expired'}
local function renew(state, live, holder, token, ttl)
  local bad = check_state(state, holder, token)
  if bad then
    return {bad}
  end
  -- PEXPIRE is also check's live test: it extends no missing key.
  if redis.call('PEXPIRE', live, ttl) == 0 then
    return {'expired'}
  end
  redis.call('HSET', state, 'ttl', ttl, 'exp', dec(now_ms() + tonumber(ttl)))
  return {'ok'}
end

-- Ends the lease (keys state, live) of holder + token at once; phase
-- 'released' marks a clean hand-off, nil leaves it 'held', so that the
-- lease reads as expired. Publishes the work ID on channel to wake
-- waiters. {'ok'} | {'fenced'} | {'expired'}
local function finish(state, live, holder, token, phase, channel, work_id)
  local bad = check_state(state, holder, token)
  if bad then
    return {bad}
  end
  -- DEL is also check's live test: it deletes nothing on a missing key.
  if redis.call('DEL', live) == 0 then
    return {'expired'}
  end
  if phase then
    redis.call('HSET', state, 'phase', phase, 'exp', dec(now_ms()))
  else
    redis.call('HSET', state, 'exp', dec(now_ms()))
  end
  redis.call('PUBLISH', channel, work_id)
  return {'ok'}
end
