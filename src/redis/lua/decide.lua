-- decide: ARGV = P, max attempts (0: none), then (what, id, key, delay µs or reason) for each
-- decision; what is 'ack' (give_up too), 'retry' or 'bad'. Returns for each: 0 if the lease
-- was lost (the values went, or will go, to another delivery), 1 if done, 2 if a retry
-- beyond max attempts made a dead letter instead.
local max_attempts = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 4 do
  local what, id, k = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local s = skey(k)
  if redis.call('HGET', s, 'fl') ~= id then
    out[#out + 1] = 0
  else
    unlease(id)
    if what == 'ack' then
      remove_front(k, s)
      out[#out + 1] = 1
    elseif what == 'bad' then
      to_dead(k, s, 'bad', ARGV[i + 3])
      out[#out + 1] = 1
    elseif max_attempts > 0 and tonumber(redis.call('HGET', s, 'fa')) >= max_attempts then
      to_dead(k, s, 'dead', 'retried on the last attempt')
      out[#out + 1] = 2
    else
      requeue(k, s, tonumber(ARGV[i + 3]))
      out[#out + 1] = 1
    end
  end
end
return out
