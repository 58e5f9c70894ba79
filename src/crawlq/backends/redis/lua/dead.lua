-- dead: takes dead letters of a queue out, requeueing them (due now, at their priority,
-- attempts afresh) or purging them. ARGV[3]: msgpack {queue, requeue, keys or false for the oldest
-- `most`, most}. Returns how many were taken.
local args = cmsgpack.unpack(ARGV[3])
local queue, requeue_them, keys, most = args[1], args[2], args[3], args[4]
local dead, order = qkey(queue, 'x'), qkey(queue, 'xo')
if not keys then keys = redis.call('ZRANGE', order, 0, most - 1) end
local taken, touched = 0, {}
for _, key in ipairs(keys) do
    local raw = redis.call('HGET', dead, key)
    if raw then
        local letter = cmsgpack.unpack(raw)
        redis.call('HDEL', dead, key)
        redis.call('ZREM', order, key)
        count(queue, DEAD, -1)
        taken = taken + 1
        if requeue_them then
            apply({queue, key, letter[1], letter[2], NOW, letter[9] or 0, OVERWRITE, raw_digest(letter[7]),
                   '0', '0', true}, touched)
        end
    end
end
settle(touched, {})
flush()
wake()
return taken
