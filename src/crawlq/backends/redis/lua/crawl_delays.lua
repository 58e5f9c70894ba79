-- crawl_delays: raises groups' Crawl-delays (P cd), floors under the intervals their rules
-- give them; the limits of those groups follow at once. Never lowers one.
-- ARGV[3]: msgpack {adopt, group, seconds, group, seconds, ...}; with adopt true, the
--   Crawl-delay rules an older crawlq stored (each its group's name as a pattern, noted
--   "crawl" in P lo, which outranked every glob) become Crawl-delays first.
local args = cmsgpack.unpack(ARGV[3])
local raised = {}
local function raise(group, seconds)
    local stored = tonumber(redis.call('HGET', P .. 'cd', group))
    if stored == nil or seconds > stored then
        redis.call('HSET', P .. 'cd', group, fmt(seconds))
        raised[group] = true
    end
end
if args[1] then
    local origins = redis.call('HGETALL', P .. 'lo')
    for i = 1, #origins, 2 do
        local glob = origins[i]
        if origins[i + 1] == 'crawl' then
            -- Its group's name, with the wildcard characters bracketed (glob_escape) if any.
            local group = string.gsub(glob, '%[([%*%?%[])%]', '%1')
            local hash = P .. (is_exact(glob) and 'lx' or 'limits')
            local rule = redis.call('HGET', hash, glob)
            redis.call('HDEL', hash, glob)
            redis.call('HDEL', P .. 'lo', glob)
            if rule then raise(group, cmsgpack.unpack(rule)[5]) end
            raised[group] = true
        end
    end
end
for i = 2, #args, 2 do raise(args[i], args[i + 1]) end
local gates = {}
for group in pairs(raised) do
    if group_id(group) then follow_limits(group, gates) end
end
settle({}, gates)
flush()
wake()
return 0
