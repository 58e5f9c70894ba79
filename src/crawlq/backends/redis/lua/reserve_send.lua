-- reserve_send: the time of a group's next request, ARGV[3] msgpack {group, gap, earliest,
-- replacing, max_wait}: at least gap seconds after the group's previous reservation and
-- earliest seconds from now. With replacing (a time returned before, else false) still the
-- group's latest reservation, it is kept and moves to earliest seconds from now (never
-- earlier): the request that held it, late, may go at once, nobody counting from it yet.
-- A new time more than max_wait (or false) seconds away is returned but not reserved.
-- Returns {the reserved time, the seconds from now to it} as strings, and 1 if replacing was
-- kept, else 0.
local args = cmsgpack.unpack(ARGV[3])
local group, gap, earliest, replacing, max_wait = args[1], args[2], args[3], args[4], args[5]
local previous = tonumber(redis.call('HGET', P .. 'sent', group))
local at
local kept = replacing and previous == replacing
if kept then
    at = math.max(NOW + earliest, previous)
else
    at = NOW + earliest
    if previous and previous + gap > at then
        at = previous + gap
    end
end
if kept or not max_wait or at - NOW <= max_wait then
    redis.call('HSET', P .. 'sent', group, fmt(at))
    -- A host without elements (a redirect's, a rendered page's resource): its reservation goes
    -- once it no longer counts (`retire`).
    if redis.call('EXISTS', gkey(group)) == 0 then
        redis.call('ZADD', P .. 'idle', 'GT', fmt(at + math.max(gap, RETIRE_AFTER)), group)
    end
end
return {fmt(at), fmt(at - NOW), kept and 1 or 0}
