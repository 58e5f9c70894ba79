-- reserve_send: the time of a group's next request, ARGV[3] msgpack {group, gap, earliest,
-- replacing}: at least gap seconds after the group's previous reservation and earliest
-- seconds from now. With replacing (a time returned before, else false) still the group's
-- latest reservation, that one moves to now instead (never earlier): the request that held
-- it, late, goes at once. Returns {the reserved time, the seconds from now to it}, as strings.
local args = cmsgpack.unpack(ARGV[3])
local group, gap, earliest, replacing = args[1], args[2], args[3], args[4]
local previous = tonumber(redis.call('HGET', P .. 'sent', group))
local at
if replacing and previous == replacing then
    at = math.max(NOW, previous)
else
    at = NOW + earliest
    if previous and previous + gap > at then
        at = previous + gap
    end
end
redis.call('HSET', P .. 'sent', group, fmt(at))
return {fmt(at), fmt(at - NOW)}
