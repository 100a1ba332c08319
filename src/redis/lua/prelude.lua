-- Shared by every script of the Redis flavour; each script's own body follows it.
--
-- One shard of one queue lives under the prefix P (ARGV[1]), a hash tag such as `{q}`, so
-- all of its Redis keys share one cluster slot:
--   P:meta   HASH  epoch (ms), window (µs), flavour, shards, version, closed, seq, bid, pending
--   P:due    ZSET  key -> score: deadline (ms since epoch) * 4096 + run counter mod 4096,
--                  for the keys with values waiting and no delivery in flight
--   P:l:<k>  LIST  the key's values, oldest first; a delivery in flight is its first `fn`
--   P:s:<k>  HASH  the key's state (see below)
--   P:lease  ZSET  delivery id ("<bid>@<epoch>.<server µs>") -> lease expiry (ms, server clock)
--   P:lk     HASH  delivery id -> key
--   P:held   ZSET  key -> when its retry delay is over (ms), for keys held by one
--   P:wake   ZSET  a marker that receivers pop with BZPOPMIN to wake early
--   P:dead, P:bad  LISTs of dead letters: key, "attempts|count|reason", then the values
-- The key's state: ent (ms its oldest waiting value arrived), runs (how many times each of the
-- front values was handed out, as "count:values,..." from the front, for the values that came
-- back), hold (its score, while a retry delay holds it in HELD);
-- while a delivery is in flight: fl (its id), fn (its count), fa (its attempt), osc (the
-- score it had), rest (values behind it that were due with it), nsc and nen (score and
-- arrival of the run that started while it was in flight).
local P = ARGV[1]
local META = P .. ':meta'
local DUE = P .. ':due'
local WAKE = P .. ':wake'
local LEASE = P .. ':lease'
local LK = P .. ':lk'
local HELD = P .. ':held'
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local epoch = tonumber(redis.call('HGET', META, 'epoch'))
if not epoch and not OPENING then
  return redis.error_reply('KBGONE the queue ' .. P .. ' is not on this server: it was deleted, or the server restarted without persistence')
end
-- Deadlines past this (about 69 years) never come due: they go out at close. It keeps every
-- score an exact integer in a double.
local NEVER = 2199023255551

local function lkey(k) return P .. ':l:' .. k end
local function skey(k) return P .. ':s:' .. k end

-- The score of a run due at `rel` ms after the epoch; the run counter orders equal deadlines.
local function score_at(rel)
  if rel > NEVER then rel = NEVER end
  local seq = redis.call('HINCRBY', META, 'seq', 1)
  return rel * 4096 + (seq % 4096)
end

-- The ms after the epoch at which something `us` µs from now is due: rounded up, never early.
local function due_in(us)
  return math.ceil((now_us + us) / 1000) - epoch
end

-- Puts `k` in line with `score`, waking a receiver if it is now the first.
local function enqueue(k, score)
  local head = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  redis.call('ZADD', DUE, score, k)
  if not head[2] or score < tonumber(head[2]) then
    redis.call('ZADD', WAKE, 0, 'w')
  end
end

-- Ends the lease of delivery `id`.
local function unlease(id)
  redis.call('ZREM', LEASE, id)
  redis.call('HDEL', LK, id)
end

-- A key's `runs`, as a list of { count, values }, front first. Counts fall from front to
-- back, since values come back in front.
local function runs_of(s)
  local runs = {}
  for c, n in string.gmatch(redis.call('HGET', s, 'runs') or '', '(%d+):(%d+)') do
    runs[#runs + 1] = { tonumber(c), tonumber(n) }
  end
  return runs
end

-- Stores `runs`, merging neighbours of equal count; none: the key's values are all new.
local function set_runs(s, runs)
  local parts, last = {}, nil
  for _, run in ipairs(runs) do
    if last and last[1] == run[1] then
      last[2] = last[2] + run[2]
    elseif run[2] > 0 then
      last = { run[1], run[2] }
      parts[#parts + 1] = last
    end
  end
  if #parts == 0 then
    redis.call('HDEL', s, 'runs')
    return
  end
  for i, run in ipairs(parts) do parts[i] = run[1] .. ':' .. run[2] end
  redis.call('HSET', s, 'runs', table.concat(parts, ','))
end

-- The runs once the front `n` values went out and came back: each was handed out once more.
local function handed_again(runs, n)
  local out = {}
  for _, run in ipairs(runs) do
    local c, m = run[1], run[2]
    if n >= m then
      out[#out + 1] = { c + 1, m }
    elseif n > 0 then
      out[#out + 1] = { c + 1, n }
      out[#out + 1] = { c, m - n }
    else
      out[#out + 1] = run
    end
    n = math.max(0, n - m)
  end
  if n > 0 then
    -- Values after the runs were never handed out before.
    out[#out + 1] = { 1, n }
  end
  return out
end

-- The runs once the front `n` values left.
local function without_front(runs, n)
  local out = {}
  for _, run in ipairs(runs) do
    local m = run[2]
    if n < m then out[#out + 1] = { run[1], m - n } end
    n = math.max(0, n - m)
  end
  return out
end

-- The delivery in flight for `k` goes back in front of its key's values, due in `delay_us`.
-- It keeps the rank it had when it was taken: once due again, it goes ahead of keys that
-- came due after it (in memory too, unless values came for it meanwhile: see the table of
-- differences in the module docs). A delayed key waits in HELD until its delay is over.
local function requeue(k, s, delay_us)
  local st = redis.call('HMGET', s, 'fn', 'osc')
  set_runs(s, handed_again(runs_of(s), tonumber(st[1])))
  redis.call('HDEL', s, 'fl', 'fn', 'fa', 'osc', 'rest', 'nsc', 'nen')
  if delay_us > 0 then
    redis.call('HSET', s, 'hold', st[2])
    redis.call('ZADD', HELD, due_in(delay_us) + epoch, k)
    -- A waiting receiver's timer knows nothing of this delay's end: wake one to look, if
    -- it is the first to end.
    if redis.call('ZRANGE', HELD, 0, 0)[1] == k then
      redis.call('ZADD', WAKE, 0, 'w')
    end
  else
    enqueue(k, tonumber(st[2]))
  end
end

-- Keys whose retry delay is over (all of them once closed) go back in line, at their rank.
local function release(closed)
  local limit = now_ms
  if closed then limit = '+inf' end
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', HELD, '-inf', limit, 'LIMIT', 0, 1000)) do
    local s = skey(k)
    redis.call('ZREM', HELD, k)
    enqueue(k, tonumber(redis.call('HGET', s, 'hold')))
    redis.call('HDEL', s, 'hold')
  end
end

-- The delivery in flight for `k` leaves the queue: acked, given up or dead.
local function remove_front(k, s)
  local st = redis.call('HMGET', s, 'fn', 'rest', 'osc', 'nsc', 'nen')
  local fn = tonumber(st[1])
  local L = lkey(k)
  redis.call('LTRIM', L, fn, -1)
  local pending = redis.call('HINCRBY', META, 'pending', -fn)
  set_runs(s, without_front(runs_of(s), fn))
  redis.call('HDEL', s, 'fl', 'fn', 'fa', 'osc', 'rest', 'nsc', 'nen', 'hold')
  if redis.call('LLEN', L) == 0 then
    redis.call('DEL', s)
  elseif tonumber(st[2] or '0') > 0 or not st[4] then
    -- The rest of a split key was due with it, and stays first among equals.
    enqueue(k, tonumber(st[3]))
  else
    redis.call('HSET', s, 'ent', st[5])
    enqueue(k, tonumber(st[4]))
  end
  if pending <= 0 and redis.call('HGET', META, 'closed') == '1' then
    -- Closed and empty: wake receivers so that their streams end.
    redis.call('ZADD', WAKE, 0, 'w')
  end
end

-- The delivery in flight for `k` becomes a dead letter on LIST `P:<list>`.
local function to_dead(k, s, list, reason)
  local st = redis.call('HMGET', s, 'fn', 'fa')
  local fn = tonumber(st[1])
  local D = P .. ':' .. list
  redis.call('RPUSH', D, k, st[2] .. '|' .. fn .. '|' .. reason)
  -- In chunks: unpack has a limit on how many values it spreads.
  for from = 0, fn - 1, 1000 do
    redis.call('RPUSH', D, unpack(redis.call('LRANGE', lkey(k), from, math.min(from + 999, fn - 1))))
  end
  remove_front(k, s)
end

-- The number of ms until the first key is due or the first lease runs out; -1 if neither.
local function next_wake()
  local closed = redis.call('HGET', META, 'closed') == '1'
  local best = -1
  local head = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  if head[2] then
    local rel = math.floor(tonumber(head[2]) / 4096)
    if closed then
      best = 0
    elseif rel < NEVER then
      best = math.max(0, rel + epoch - now_ms)
    end
  end
  local held = redis.call('ZRANGE', HELD, 0, 0, 'WITHSCORES')
  if held[2] then
    local wait = 0
    if not closed then wait = math.max(0, tonumber(held[2]) - now_ms) end
    if best < 0 or wait < best then best = wait end
  end
  local lease = redis.call('ZRANGE', LEASE, 0, 0, 'WITHSCORES')
  if lease[2] then
    local wait = math.max(0, tonumber(lease[2]) + 1 - now_ms)
    if best < 0 or wait < best then best = wait end
  end
  return best
end
