-- block: no element of a group starts before a time; ARGV[3] msgpack {group, until or false,
-- reason or false}. Lifting a block (false) makes the group claimable at once.
local args = cmsgpack.unpack(ARGV[3])
local group, blocked_until, reason = args[1], args[2], args[3]
if group == '' then return 1 end  -- elements in no group have no limits to keep
ensure_group(group)
if blocked_until then
    redis.call('HSET', gkey(group), 'bu', fmt(blocked_until))
    if reason then
        redis.call('HSET', gkey(group), 'br', reason)
    else
        redis.call('HDEL', gkey(group), 'br')
    end
else
    redis.call('HDEL', gkey(group), 'bu', 'br')
end
settle({}, {[group] = true})
flush()
retire(group)  -- a group blocked with nothing queued (a redirect's host) goes when it can
wake()
return 1
