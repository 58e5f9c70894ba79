-- workers: registers a worker (ARGV[3] msgpack {id, host, pid, queues, wake address,
-- concurrency}) and
-- forgets workers whose heartbeat is older than ARGV[4] seconds.
local args = cmsgpack.unpack(ARGV[3])
local ttl = tonumber(ARGV[4])
local flat = redis.call('HGETALL', P .. 'workers')
for i = 1, #flat, 2 do
    if cmsgpack.unpack(flat[i + 1])[5] < NOW - ttl then
        redis.call('HDEL', P .. 'workers', flat[i])
        redis.call('DEL', P .. 'w:' .. flat[i])
    end
end
local raw = redis.call('HGET', P .. 'workers', args[1])
local started = raw and cmsgpack.unpack(raw)[4] or NOW
redis.call('HSET', P .. 'workers', args[1],
           cmsgpack.pack({args[2], args[3], args[4], started, NOW, args[5], args[6]}))
return 1
