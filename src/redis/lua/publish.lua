-- publish: ARGV = P, capacity (0: none), then (key, value, within µs or -1) for each send.
-- Returns -1 if the queue is closed, else how many sends, from the first, went in: a full
-- queue refuses the rest, so that no send overtakes an earlier one of the same call.
if redis.call('HGET', META, 'closed') == '1' then return -1 end
local window = tonumber(redis.call('HGET', META, 'window'))
local cap = tonumber(ARGV[2])
local pending = tonumber(redis.call('HGET', META, 'pending'))
local head = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
local first = head[2] and tonumber(head[2])
local moved = false
local taken = 0
for i = 3, #ARGV, 3 do
  if cap > 0 and pending >= cap then break end
  local k = ARGV[i]
  local within = tonumber(ARGV[i + 2])
  local wait = window
  if within >= 0 and within < wait then wait = within end
  local len = redis.call('RPUSH', lkey(k), ARGV[i + 1])
  pending = pending + 1
  taken = taken + 1
  local s = skey(k)
  local st = redis.call('HMGET', s, 'fl', 'hold', 'nsc')
  -- A send without `within` after others of its run is due no earlier than they are: its
  -- run's score stands, and it need not be worked out.
  local later = within < 0
  if st[1] then
    -- In flight: the values sent meanwhile start the key's next run.
    if not (later and st[3]) then
      local score = score_at(due_in(wait))
      if not st[3] or score < tonumber(st[3]) then redis.call('HSET', s, 'nsc', score) end
      redis.call('HSETNX', s, 'nen', now_ms)
    end
  else
    if len == 1 then redis.call('HSET', s, 'ent', now_ms) end
    if not st[2] and not (later and len > 1) then
      -- LT, not NX: a send_by may have started the run with a later deadline than this.
      local score = score_at(due_in(wait))
      redis.call('ZADD', DUE, 'LT', score, k)
      if not first or score < first then
        first = score
        moved = true
      end
    end
  end
end
redis.call('HSET', META, 'pending', pending)
if moved then redis.call('ZADD', WAKE, 0, 'w') end
return taken
