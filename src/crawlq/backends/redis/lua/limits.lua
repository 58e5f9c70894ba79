-- limits: adds or replaces glob rules and deletes one; the limits of every group they match
-- follow at once. Exact rules (a Crawl-delay's, one for each such host) touch their own group
-- alone, so setting one costs the same with 100,000 groups as with ten.
-- ARGV[3]: msgpack {pattern to delete or false, rules...}; a rule is
--   {glob, lua pattern, specificity a, specificity b, concurrency or false, interval}
-- Returns 1 when the pattern to delete existed, else 0.
local args = cmsgpack.unpack(ARGV[3])
local deleted = 0
local names, globs = {}, {}  -- the exact patterns changed; the Lua patterns of the globs
local function changed(pattern, lua_pattern)
    if is_exact(pattern) then names[pattern] = true else table.insert(globs, lua_pattern) end
end
if args[1] then
    local old = redis.call('HGET', P .. 'limits', args[1])
    if old then
        redis.call('HDEL', P .. 'limits', args[1])
        changed(args[1], cmsgpack.unpack(old)[1])
        deleted = 1
    end
    if redis.call('HDEL', P .. 'lx', args[1]) == 1 then
        changed(args[1])
        deleted = 1
    end
end
for i = 2, #args do
    local rule = args[i]
    local packed = cmsgpack.pack({rule[2], rule[3], rule[4], rule[5], rule[6]})
    if is_exact(rule[1]) then
        redis.call('HSET', P .. 'lx', rule[1], packed)
    else
        redis.call('HSET', P .. 'limits', rule[1], packed)
    end
    changed(rule[1], rule[2])
end
local gates = {}
local function follow(group)
    local concurrency, interval = resolve(group)
    local current = redis.call('HMGET', gkey(group), 'c', 'i')
    if tonumber(current[1]) ~= (concurrency or nil) or tonumber(current[2]) ~= interval then
        if concurrency then
            redis.call('HSET', gkey(group), 'c', concurrency, 'i', fmt(interval))
        else
            redis.call('HDEL', gkey(group), 'c')
            redis.call('HSET', gkey(group), 'i', fmt(interval))
        end
        gates[group] = true
    end
end
if #globs > 0 then
    for _, group in ipairs(redis.call('HVALS', P .. 'gn')) do
        local hit = names[group]
        for _, glob in ipairs(globs) do
            hit = hit or string.find(group, glob) ~= nil
        end
        if hit then follow(group) end
    end
else
    for name in pairs(names) do
        if group_id(name) then follow(name) end
    end
end
settle({}, gates)
flush()
wake()
return deleted
