-- pull: ARGV = P, max values, lease ms, max attempts (0: none), most keys to look at.
-- Reclaims the leases that ran out, then takes the due keys in score order. Returns
-- { now ms, ms until the next wake or -1, closed, pending, { deliveries } }, each delivery
-- { key, id, attempt, entered ms, { values } }.
local budget = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local max_attempts = tonumber(ARGV[4])
-- A lease set at ms m lasts until m + lease is past, so that it is never short.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LEASE, '-inf', '(' .. now_ms, 'LIMIT', 0, 100)) do
  local k = redis.call('HGET', LK, id)
  unlease(id)
  if k then
    local s = skey(k)
    if redis.call('HGET', s, 'fl') == id then
      if max_attempts > 0 and tonumber(redis.call('HGET', s, 'fa')) >= max_attempts then
        to_dead(k, s, 'dead', 'its lease ran out on the last attempt')
      else
        requeue(k, s, 0)
      end
    end
  end
end
local closed = redis.call('HGET', META, 'closed') == '1'
release(closed)
local limit = '+inf'
if not closed then limit = (now_ms - epoch) * 4096 + 4095 end
local due = redis.call('ZRANGEBYSCORE', DUE, '-inf', limit, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[5]))
local taken = {}
local out = { now_ms, 0, closed and 1 or 0, 0, taken }
for i = 1, #due, 2 do
  if budget <= 0 then break end
  local k = due[i]
  local L = lkey(k)
  local s = skey(k)
  local len = redis.call('LLEN', L)
  local n = math.min(len, budget)
  local ent = redis.call('HGET', s, 'ent')
  local front = runs_of(s)[1]
  local attempt = 1
  if front then attempt = front[1] + 1 end
  -- With the epoch and the server's time: a queue whose data was deleted counts deliveries
  -- from 1 again, and one restored from an older snapshot from where the snapshot was, and a
  -- delivery held from before must not decide, or renew, a new one.
  local id = redis.call('HINCRBY', META, 'bid', 1) .. '@' .. epoch .. '.' .. now_us
  redis.call('ZREM', DUE, k)
  redis.call('HSET', s, 'fl', id, 'fn', n, 'fa', attempt, 'osc', due[i + 1], 'rest', len - n)
  redis.call('ZADD', LEASE, now_ms + lease, id)
  redis.call('HSET', LK, id, k)
  taken[#taken + 1] = { k, id, attempt, tonumber(ent or now_ms), redis.call('LRANGE', L, 0, n - 1) }
  budget = budget - n
end
out[2] = next_wake()
if #taken > 0 and out[2] >= 0 then
  -- More waits, now or later: wake another receiver to take it or to set its timer for
  -- it, since only this one has seen when.
  redis.call('ZADD', WAKE, 0, 'w')
end
out[4] = tonumber(redis.call('HGET', META, 'pending'))
return out
