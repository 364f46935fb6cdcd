-- release: KEYS state, live; ARGV holder, token, channel, work ID.
-- Ends the lease at once, marks it released, wakes waiters.
-- {'ok'} | {'fenced'} | {'expired'}
return finish(KEYS[1], KEYS[2], ARGV[1], ARGV[2], 'released', ARGV[3], ARGV[4])
