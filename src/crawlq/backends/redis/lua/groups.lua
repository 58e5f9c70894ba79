-- groups: per-group stats. ARGV[3]: msgpack {lua pattern, limit, include idle}
-- Returns msgpack list of {name, queued, running, concurrency or false, interval,
-- last start or false, blocked until or false, reason or false}, busiest first.
local args = cmsgpack.unpack(ARGV[3])
local pattern, limit, include_idle = args[1], args[2], args[3]

local function row(group, g)
    return {group, tonumber(g[1]) or 0, tonumber(g[2]) or 0, tonumber(g[3]) or false,
            tonumber(g[4]) or 0, tonumber(g[5]) or false, tonumber(g[6]) or false, g[7] or false}
end

-- Busy groups only: read the busy index in order until `limit` match, never every group.
if not include_idle then
    local out, start, chunk = {}, 0, math.max(limit, 100)
    while #out < limit do
        local groups = redis.call('ZRANGE', P .. 'busy', start, start + chunk - 1)
        for _, group in ipairs(groups) do
            if string.find(group, pattern) then
                table.insert(out, row(group, redis.call('HMGET', gkey(group), 'q', 'r', 'c', 'i', 'ls', 'bu', 'br')))
                if #out == limit then break end
            end
        end
        if #groups < chunk then break end
        start = start + chunk
    end
    return cmsgpack.pack(out)
end

local rows = {}
for _, group in ipairs(redis.call('HVALS', P .. 'gn')) do
    if string.find(group, pattern) then
        table.insert(rows, row(group, redis.call('HMGET', gkey(group), 'q', 'r', 'c', 'i', 'ls', 'bu', 'br')))
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
