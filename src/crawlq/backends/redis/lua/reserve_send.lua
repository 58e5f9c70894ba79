-- reserve_send: the time of a group's next request, ARGV[3] msgpack {group, gap, earliest}:
-- at least gap seconds after the group's previous reservation and earliest seconds from now.
-- Returns the seconds from now to it, as a string.
local args = cmsgpack.unpack(ARGV[3])
local group, gap, earliest = args[1], args[2], args[3]
local at = NOW + earliest
local previous = tonumber(redis.call('HGET', P .. 'sent', group))
if previous and previous + gap > at then
    at = previous + gap
end
redis.call('HSET', P .. 'sent', group, fmt(at))
return fmt(at - NOW)
