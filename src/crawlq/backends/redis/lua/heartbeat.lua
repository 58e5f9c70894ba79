-- heartbeat: extends the leases a worker still holds and records that it is alive. Returns 0
-- if the worker is not registered (pruned after WORKER_TTL of silence), 1 otherwise.
-- ARGV[3]: msgpack {worker id, lease seconds or a map of them by queue, items...}; an item is
--   {queue, key, id, attempt, digest (6 bytes), claimed at}
local args = cmsgpack.unpack(ARGV[3])
local worker, lease = args[1], args[2]
for i = 3, #args do
    local queue, key, id, attempt, digest, claimed_at = unpack(args[i], 1, 6)
    local rec, field = find(queue, key, digest)
    if holds(rec, id, attempt, claimed_at) and rec[STATE] == RUNNING then
        local lease_until = NOW + (type(lease) == 'table' and lease[queue] or lease)
        rec[LEASE] = lease_until
        save(queue, field, rec)
        redis.call('ZADD', P .. 'leases', fmt(lease_until), lease_member(queue, field))
    end
end
local raw = redis.call('HGET', P .. 'workers', worker)
if raw then
    local info = cmsgpack.unpack(raw)
    info[5] = NOW
    redis.call('HSET', P .. 'workers', worker, cmsgpack.pack(info))
    return 1
end
return 0
