-- extend: ARGV = P, lease ms, ids... Renews the leases still held; returns 1 or 0 for each.
local out = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', LEASE, ARGV[i]) then
    redis.call('ZADD', LEASE, 'XX', now_ms + tonumber(ARGV[2]), ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
