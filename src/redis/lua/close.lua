-- close: ARGV = P. Closes the queue for good: sends fail, and every key is due at once.
redis.call('HSET', META, 'closed', 1)
redis.call('ZADD', WAKE, 0, 'w')
return 1
