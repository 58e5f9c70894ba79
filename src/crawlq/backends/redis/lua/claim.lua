-- claim: leases up to `limit` claimable elements of the given queues (SPEC 3.3, 3.4).
-- ARGV[3]: msgpack {worker, limit, lease, queues...}
-- Returns msgpack {next_at or false, now, {queue, key, payload, group, priority, due, attempt,
-- id}...}
local args = cmsgpack.unpack(ARGV[3])
local worker, limit, lease = args[1], args[2], args[3]
local queues = {}
for i = 4, #args do
    if queue_config(args[i]) then table.insert(queues, args[i]) end
end

-- 1. leases that expired go back to their queue and free their group's slot
local expired = redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', '(' .. fmt(NOW), 'LIMIT', 0, 200)
local touched, gates = {}, {}
for _, member in ipairs(expired) do
    local queue, field = split_lease_member(member)
    local rec = load(queue, field)
    if rec == nil or rec[STATE] ~= RUNNING then
        redis.call('ZREM', P .. 'leases', member)
    else
        requeue(queue, field, rec, false, 0, 'lease expired', touched)
        gates[rec[GROUP]] = true
    end
end
local opened = #expired > 0 and settle(touched, gates)

for _, queue in ipairs(queues) do
    -- 2. delayed elements that became due join their sub-queues
    local due = redis.call('ZRANGEBYSCORE', qkey(queue, 'd'), '-inf', fmt(NOW), 'LIMIT', 0, 5000)
    if #due > 0 then
        local promoted = {}
        for _, field in ipairs(due) do
            local rec = load(queue, field)
            redis.call('ZREM', qkey(queue, 'd'), field)
            count(queue, DELAYED, -1)
            rec[STATE] = READY
            redis.call('ZADD', qkey(queue, 'r:' .. rec[GROUP]), -rec[PRIORITY], rank(rec) .. field)
            count(queue, READY, 1)
            save(queue, field, rec)
            promoted[rec[GROUP]] = true
        end
        for group, _ in pairs(promoted) do refresh_pair(queue, group) end
    end
    -- 3. waiting rows whose gate passed become active
    for _, group in ipairs(redis.call('ZRANGEBYSCORE', qkey(queue, 'fw'), '-inf', fmt(NOW))) do
        refresh_pair(queue, group)
    end
end

-- 4. take the best active head, again and again
local result = {false, NOW}
local lease_until = NOW + lease
while #result - 2 < limit do
    local best_queue, best_score, best_member = nil, nil, nil
    for _, queue in ipairs(queues) do
        local head = redis.call('ZRANGE', qkey(queue, 'fa'), 0, 0, 'WITHSCORES')
        if head[1] then
            local score = tonumber(head[2])
            if best_queue == nil or score < best_score or (score == best_score
                    and (before(head[1], best_member)
                         or (head[1] == best_member and before(queue, best_queue)))) then
                best_queue, best_score, best_member = queue, score, head[1]
            end
        end
    end
    if best_queue == nil then break end
    local queue, group = best_queue, string.sub(best_member, RANK_SIZE + 1)
    local member = redis.call('ZPOPMIN', qkey(queue, 'r:' .. group))[1]
    local field = string.sub(member, RANK_SIZE + 1)
    local rec = load(queue, field)
    local key = rec[KEY]
    count(queue, READY, -1)
    count(queue, RUNNING, 1)
    group_count(group, 'q', -1)
    group_count(group, 'r', 1)
    rec[STATE], rec[ATTEMPTS], rec[LEASE], rec[WORKER] = RUNNING, rec[ATTEMPTS] + 1, lease_until, worker
    save(queue, field, rec)
    table.insert(lease_adds, fmt(lease_until))
    table.insert(lease_adds, lease_member(queue, field))
    add(P .. 'wrun', worker, 1)
    if group ~= '' then
        redis.call('HSET', gkey(group), 'ls', fmt(NOW))
        refresh_gate(group)
    else
        refresh_pair(queue, group)
    end
    table.insert(result, {queue, key, rec[PAYLOAD] or key, group, rec[PRIORITY], rec[DUE],
                          rec[ATTEMPTS], rec[ID]})
end

flush()

-- 5. nothing more to take: say when something may be
if #result - 2 < limit then
    local next_at = NEVER
    local function earliest(zkey)
        local first = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
        if first[2] then
            local t = tonumber(first[2])
            if t < next_at then next_at = t end
        end
    end
    earliest(P .. 'leases')
    for _, queue in ipairs(queues) do
        earliest(qkey(queue, 'fw'))
        earliest(qkey(queue, 'd'))
    end
    if next_at < NEVER then
        if next_at < NOW then next_at = NOW end
        result[1] = next_at
    end
end
if opened then wake() end
return cmsgpack.pack(result)
