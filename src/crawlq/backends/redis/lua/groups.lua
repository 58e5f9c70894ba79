-- groups: per-group stats. ARGV[3]: msgpack {lua pattern, limit, include idle}
-- Returns msgpack list of {name, queued, running, concurrency or false, interval,
-- last start or false, blocked until or false, reason or false}, busiest first.
local args = cmsgpack.unpack(ARGV[3])
local pattern, limit, include_idle = args[1], args[2], args[3]
local rows = {}
for _, group in ipairs(redis.call('SMEMBERS', P .. 'groups')) do
    if string.find(group, pattern) then
        local g = redis.call('HMGET', gkey(group), 'q', 'r', 'c', 'i', 'ls', 'bu', 'br')
        local queued, running = tonumber(g[1]) or 0, tonumber(g[2]) or 0
        if include_idle or queued > 0 or running > 0 then
            table.insert(rows, {group, queued, running, tonumber(g[3]) or false,
                                tonumber(g[4]) or 0, tonumber(g[5]) or false,
                                tonumber(g[6]) or false, g[7] or false})
        end
    end
end
table.sort(rows, function(a, b)
    if a[3] ~= b[3] then return a[3] > b[3] end
    if a[2] ~= b[2] then return a[2] > b[2] end
    return a[1] < b[1]
end)
local out = {}
for i = 1, math.min(limit, #rows) do out[i] = rows[i] end
return cmsgpack.pack(out)
