-- limits: adds or replaces glob rules and deletes one (and the Crawl-delay of a group so
-- named); the limits of every group they match follow at once. Exact rules touch their own
-- group alone, so setting one costs the same with 100,000 groups as with ten.
-- ARGV[3]: msgpack {pattern to delete or false, rules...}; a rule is
--   {glob, lua pattern, specificity a, specificity b, concurrency or false, interval, origin}
--   stored without its glob and origin (as crawlq stored rules before they had one, so an
--   older crawlq on the same namespace still reads them); origin "operator" goes to P lo by
--   glob, and "app" is none there.
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
    if redis.call('HDEL', P .. 'cd', args[1]) == 1 then
        names[args[1]] = true  -- the group of that very name, whatever its characters
        deleted = 1
    end
end
-- Whether the rule stored for `glob` stays, as limits.merged in Python decides: an operator's
-- rule outlasts the app's. (A rule an older crawlq replaced keeps the origin noted before;
-- "crawl", an older crawlq's Crawl-delay rule, is replaced as the app's is.)
local function kept(hash, glob, by)
    return by ~= 'operator' and redis.call('HGET', P .. 'lo', glob) == 'operator'
        and redis.call('HEXISTS', hash, glob) == 1
end
for i = 2, #args do
    local item = args[i]
    local glob, by, rule = item[1], item[7], {item[2], item[3], item[4], item[5], item[6]}
    local hash = P .. (is_exact(glob) and 'lx' or 'limits')
    if not kept(hash, glob, by) then
        redis.call('HSET', hash, glob, cmsgpack.pack(rule))
        if by == 'app' then
            redis.call('HDEL', P .. 'lo', glob)
        else
            redis.call('HSET', P .. 'lo', glob, by)
        end
        changed(glob, rule[1])
    end
end
local gates = {}
if #globs > 0 then
    for _, group in ipairs(redis.call('HVALS', P .. 'gn')) do
        local hit = names[group]
        for _, glob in ipairs(globs) do
            hit = hit or string.find(group, glob) ~= nil
        end
        if hit then follow_limits(group, gates) end
    end
else
    for name in pairs(names) do
        if group_id(name) then follow_limits(name, gates) end
    end
end
settle({}, gates)
flush()
wake()
return deleted
