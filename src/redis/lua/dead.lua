-- dead: ARGV = P, list ('dead' or 'bad'), most records. Takes dead letters; returns
-- { closed, pending, { records } }, each record { key, "attempts|count|reason", { values } }.
local D = P .. ':' .. ARGV[2]
local records = {}
local out = { redis.call('HGET', META, 'closed') == '1' and 1 or 0,
  tonumber(redis.call('HGET', META, 'pending')), records }
for _ = 1, tonumber(ARGV[3]) do
  local head = redis.call('LPOP', D, 2)
  if not head then break end
  local n = tonumber(string.match(head[2], '^%d+|(%d+)|'))
  local values = {}
  if n > 0 then values = redis.call('LPOP', D, n) end
  records[#records + 1] = { head[1], head[2], values }
end
return out
