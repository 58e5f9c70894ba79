-- limits: adds or replaces glob rules and deletes one; every group's limits follow at once.
-- ARGV[3]: msgpack {pattern to delete or false, rules...}; a rule is
--   {glob, lua pattern, specificity a, specificity b, concurrency or false, interval}
-- Returns 1 when the pattern to delete existed, else 0.
local args = cmsgpack.unpack(ARGV[3])
local deleted = 0
if args[1] then deleted = redis.call('HDEL', P .. 'limits', args[1]) end
for i = 2, #args do
    local rule = args[i]
    redis.call('HSET', P .. 'limits', rule[1],
               cmsgpack.pack({rule[2], rule[3], rule[4], rule[5], rule[6]}))
end
local gates = {}
for _, group in ipairs(redis.call('HVALS', P .. 'gn')) do
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
settle({}, gates)
flush()
wake()
return deleted
