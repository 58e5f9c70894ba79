-- limits: adds or replaces glob rules and deletes one; the limits of every group they match
-- follow at once. Exact rules (a Crawl-delay's, one for each such host) touch their own group
-- alone, so setting one costs the same with 100,000 groups as with ten.
-- ARGV[3]: msgpack {pattern to delete or false, rules...}; a rule is
--   {glob, lua pattern, specificity a, specificity b, concurrency or false, interval, origin}
--   stored without its glob and origin (as crawlq stored rules before they had one, so an
--   older crawlq on the same namespace still reads them); origin, "operator" or "crawl", goes
--   to P lo by glob, and "app" is none there.
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
    redis.call('HDEL', P .. 'lo', args[1])
end
-- The rule to store over `stored`, set by `was` (nil: keep `stored`), and its origin, as
-- limits.merged in Python decides: an operator's rule outlasts the app's, and the app's never
-- undercuts a Crawl-delay. (A rule an older crawlq replaced keeps the origin noted before.)
local function merged(stored, was, new, by)
    if not stored or by == 'operator' or was == 'app' then return new, by end
    if by == 'crawl' then return new, was end
    if was == 'operator' then return nil end
    if new[5] < stored[5] then
        new[5] = stored[5]
        return new, 'crawl'
    end
    return new, 'app'
end
for i = 2, #args do
    local item = args[i]
    local glob, by, rule = item[1], item[7], {item[2], item[3], item[4], item[5], item[6]}
    local hash = P .. (is_exact(glob) and 'lx' or 'limits')
    local stored = redis.call('HGET', hash, glob)
    local was = stored and (redis.call('HGET', P .. 'lo', glob) or 'app')
    local origin
    rule, origin = merged(stored and cmsgpack.unpack(stored), was, rule, by)
    if rule then
        redis.call('HSET', hash, glob, cmsgpack.pack(rule))
        if origin == 'app' then
            redis.call('HDEL', P .. 'lo', glob)
        else
            redis.call('HSET', P .. 'lo', glob, origin)
        end
        changed(glob, rule[1])
    end
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
