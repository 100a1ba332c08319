-- open: ARGV = P, window_us, flavour, shards, version. Creates the queue's meta data if it is
-- not there, and returns what it holds, for the client to compare with its own.
if redis.call('HSETNX', META, 'epoch', now_ms) == 1 then
  redis.call('HSET', META, 'window', ARGV[2], 'flavour', ARGV[3], 'shards', ARGV[4],
    'version', ARGV[5], 'closed', 0, 'seq', 0, 'bid', 0, 'pending', 0)
end
return redis.call('HMGET', META, 'window', 'flavour', 'shards', 'version', 'closed')
