-- claim: leases up to `limit` claimable elements of the given queues (SPEC 3.3, 3.4).
-- ARGV[3]: msgpack {worker, limit, lease, token, again, queues...}: `lease` is seconds, or a
--   map of seconds by queue; `token` names this claim, `again` is true when the caller sends
--   it again (its reply was lost with its connection).
-- Returns msgpack {next_at or false, now, {queue, key, payload, group, priority, due, attempt,
-- id}...}
-- Keys beside the common ones: {ns}:claimed:<worker>, a string: the token and reply of the
-- worker's last claim that took anything, for as long as a sender keeps trying (at most 60 s).
local args = cmsgpack.unpack(ARGV[3])
local worker, limit, lease, token, again = args[1], args[2], args[3], args[4], args[5]
local queues = {}
for i = 6, #args do
    if queue_config(args[i]) then table.insert(queues, args[i]) end
end

-- A claim sent again gets the reply it lost, not more elements: those it leased are this
-- worker's, and no one would run them until their leases ran out.
local last_claim = P .. 'claimed:' .. worker
if again then
    local last = redis.call('GET', last_claim)
    if last and string.sub(last, 1, #token) == token then return string.sub(last, #token + 1) end
end

-- 1. leases that expired (at their end: the next claimable time step 5 says) go back to
-- their queue and free their group's slot
local expired = redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', fmt_now(), 'LIMIT', 0, 200)
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
if #expired > 0 then settle(touched, gates, true) end

for _, queue in ipairs(queues) do
    -- 2. delayed elements that became due join their sub-queues
    local due = redis.call('ZRANGEBYSCORE', qkey(queue, 'd'), '-inf', fmt_now(), 'LIMIT', 0, 5000)
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
    for _, group in ipairs(redis.call('ZRANGEBYSCORE', qkey(queue, 'fw'), '-inf', fmt_now())) do
        refresh_pair(queue, group)
    end
end

-- 4. take the best active head, again and again. While a group has room and no interval,
-- its sub-queue's next elements are taken in the same step for as long as they rank before
-- the second-best row: the same elements, in the same order, as one at a time.
local function ranks_before(score, member, other_score, other_member)
    return score < other_score or (score == other_score and before(member, other_member))
end

-- A group's limits and counts, read once for both `room` and `still_open`; the counts
-- become known to `flush` (they change only there), and its number to `decode`.
local function group_fields(group)
    if group == '' then return nil end
    local g = redis.call('HMGET', gkey(group), 'c', 'i', 'r', 'q', 'id')
    local fields = {tonumber(g[1]), tonumber(g[2]) or 0, tonumber(g[3]) or 0, tonumber(g[4]) or 0}
    known_counts(group, fields[4], fields[3])
    local id = tonumber(g[5])
    if id then note_group(group, id) end
    return fields
end

local function running_of(group, g)
    return g[3] + pending(gkey(group), 'r')
end

-- How many elements the group may start now (its row is active, so at least one).
local function room(group, g, wanted)
    if g == nil then return wanted end
    if g[2] > 0 then return 1 end
    if g[1] == nil then return wanted end
    return math.min(wanted, g[1] - running_of(group, g))
end

-- Whether the group still admits a start after the ones just taken (`gate` <= NOW): an
-- interval makes the next start wait; else it admits one while not full. (Its row was
-- active, so no block holds it.)
local function still_open(group, g)
    if g == nil then return true end
    if g[2] > 0 then return false end
    return g[1] == nil or running_of(group, g) < g[1]
end

local result = {false, NOW}
-- Each queue's lease end, as a number and as stored.
local lease_ends, longest = {}, 0
for _, queue in ipairs(queues) do
    local seconds = type(lease) == 'table' and lease[queue] or lease
    lease_ends[queue] = {NOW + seconds, fmt(NOW + seconds)}
    if seconds > longest then longest = seconds end
end

local function take(queue, group, field)
    local rec = load(queue, field)
    local lease_until, lease_score = lease_ends[queue][1], lease_ends[queue][2]
    rec[STATE], rec[ATTEMPTS], rec[LEASE], rec[WORKER] = RUNNING, rec[ATTEMPTS] + 1, lease_until, worker
    local history = rec[HISTORY] or {}
    if #history >= HISTORY_SIZE then table.remove(history, 1) end
    table.insert(history, {rec[ATTEMPTS], NOW, worker, false})
    rec[HISTORY] = history
    save(queue, field, rec)
    local member = lease_member(queue, field)
    table.insert(lease_adds, lease_score)
    table.insert(lease_adds, member)
    hold(held_adds, worker, member)
    local key = rec[KEY]
    table.insert(result, {queue, key, rec[PAYLOAD] or key, group, rec[PRIORITY], rec[DUE],
                          rec[ATTEMPTS], rec[ID]})
end

-- Takes up to n elements from the head of a sub-queue, stopping at the first that does not
-- rank before the second-best row (second_score nil: none). Reads the run in growing chunks
-- (1, 2, 4...) and one element more, as most runs end at the first element and the one after
-- is the sub-queue's new head. Returns how many it took and the new head's member and score
-- (nil: the sub-queue is empty).
local function take_run(queue, group, n, second_score, second_rank)
    local subqueue = qkey(queue, 'r:' .. group)
    local taken, chunk = 0, 1
    local next_member, next_score
    while true do
        local first, last = taken, math.min(n, taken + chunk)
        local heads = redis.call('ZRANGE', subqueue, first, last, 'WITHSCORES')
        local ended = #heads < 2 * (last - first + 1)
        for j = 1, #heads, 2 do
            local member = heads[j]
            if taken == n or (taken > 0 and second_score and not ranks_before(
                    tonumber(heads[j + 1]), string.sub(member, 1, RANK_SIZE), second_score, second_rank)) then
                next_member, next_score = member, heads[j + 1]
                break
            end
            take(queue, group, string.sub(member, RANK_SIZE + 1))
            taken = taken + 1
        end
        if ended or next_member then break end
        chunk = chunk * 2
    end
    redis.call('ZREMRANGEBYRANK', subqueue, 0, taken - 1)
    return taken, next_member, next_score
end

while #result - 2 < limit do
    local best_queue, best_score, best_member, second_score, second_member
    for _, queue in ipairs(queues) do
        local heads = redis.call('ZRANGE', qkey(queue, 'fa'), 0, 1, 'WITHSCORES')
        for j = 1, #heads, 2 do
            local member, score = heads[j], tonumber(heads[j + 1])
            if best_queue == nil or ranks_before(score, member, best_score, best_member) then
                second_score, second_member = best_score, best_member
                best_queue, best_score, best_member = queue, score, member
            elseif second_score == nil or ranks_before(score, member, second_score, second_member) then
                second_score, second_member = score, member
            end
        end
    end
    if best_queue == nil then break end
    local queue, group = best_queue, string.sub(best_member, RANK_SIZE + 1)
    local g = group_fields(group)
    local n = room(group, g, limit - (#result - 2))
    if n < 1 then
        -- An active row of a full group cannot happen (gate and room read the same counts);
        -- should it, the row is set right, and if it stays, the claim ends: never loop.
        refresh_gate(group)
        if redis.call('ZSCORE', qkey(queue, 'fa'), best_member) then break end
    else
        local taken, head, head_score = take_run(queue, group, n, second_score,
                                                 second_member and string.sub(second_member, 1, RANK_SIZE))
        count(queue, READY, -taken)
        count(queue, RUNNING, taken)
        group_count(group, 'q', -taken)
        group_count(group, 'r', taken)
        -- Its last start: written with its counts, by `flush` (the counts above reach it).
        if group ~= '' then note_start(group) end
        if still_open(group, g) then
            -- Only this row's head moved; the group's other rows stay active.
            local rows, active = qkey(queue, 'fr'), qkey(queue, 'fa')
            redis.call('ZREM', active, best_member)
            if head then
                local member = string.sub(head, 1, RANK_SIZE) .. group
                redis.call('ZADD', active, head_score, member)
                redis.call('HSET', rows, group, member)
            else
                redis.call('HDEL', rows, group)
            end
        else
            refresh_gate(group)
        end
    end
end

flush()
if #result == 2 then retire_due(RETIRE_QUIET) end  -- a quiet moment: idle groups whose time came

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
wake()
local reply = cmsgpack.pack(result)
if #result > 2 then
    -- At least 1 ms: PX 0 is an error, and it would come after every write of the claim.
    redis.call('SET', last_claim, token .. reply, 'PX', math.max(1, math.ceil(math.min(longest, 60) * 1000)))
end
return reply
