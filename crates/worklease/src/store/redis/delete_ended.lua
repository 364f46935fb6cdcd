-- delete_ended: KEYS state, live, ckpt, fence; ARGV fencing token (decimal).
-- Garbage collection: deletes the state and the checkpoint when the last
-- acquisition is still ARGV[1] and its live key is gone (released, revoked
-- or expired by the server's clock). The fencing counter stays (the work
-- ID's floor, raised to at least ARGV[1] first), so the next acquisition's
-- INCR gives a larger token.
-- {'deleted'} | {'kept'}
local token = redis.call('HGET', KEYS[1], 'token')
if token ~= ARGV[1] or redis.call('EXISTS', KEYS[2]) == 1 then
  return {'kept'}
end
local fence = redis.call('GET', KEYS[4])
if not fence or dec_gt(ARGV[1], fence) then
  redis.call('SET', KEYS[4], ARGV[1])
end
redis.call('DEL', KEYS[1], KEYS[3])
return {'deleted'}
