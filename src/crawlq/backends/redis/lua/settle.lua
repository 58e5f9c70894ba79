-- settle: ack, fail or release leased elements (SPEC 3.5, 3.6). The attempt number and the
-- claim's time fence a lease: a call from a run whose lease expired and that ran again
-- changes nothing.
-- ARGV[3]: msgpack {action, items...}; action "ack", "fail" or "release"; an item is
--   {queue, key, id, attempt, digest (6 bytes), seen digest, seen bucket, due, retry_at or false,
--    error, traceback, claimed at}
local args = cmsgpack.unpack(ARGV[3])
local action = args[1]
local touched, gates = {}, {}
for i = 2, #args do
    local queue, key, id, attempt, digest, seen, bucket, due, retry_at, err, tb, claimed_at =
        unpack(args[i], 1, 12)
    local rec, field = find(queue, key, digest)
    -- An ack finishes an element whose lease expired but that no one ran again, too.
    if holds(rec, id, attempt, claimed_at) and (action == 'ack' or rec[STATE] == RUNNING) then
        if rec[STATE] == RUNNING then gates[rec[GROUP]] = true end
        if action == 'ack' then
            finish(queue, field, rec, seen, bucket, touched)
        elseif action == 'release' then
            requeue(queue, field, rec, due, -1, false, touched)
        elseif retry_at or rec[NEXT_DUE] then
            -- A schedule that came while it ran wins over a last failure too: it would take
            -- a dead letter out again.
            requeue(queue, field, rec, retry_at, 0, err, touched)
        else
            local dead = qkey(queue, 'x')
            set_outcome(rec, err)
            local letter = {rec[PAYLOAD], rec[GROUP], rec[ATTEMPTS], err, tb, NOW, hex_digest(digest),
                            rec[HISTORY] or {}, rec[PRIORITY]}
            if redis.call('HSET', dead, key, cmsgpack.pack(letter)) == 1 then
                count(queue, DEAD, 1)
            end
            redis.call('ZADD', qkey(queue, 'xo'), fmt_now(), key)
            finish(queue, field, rec, seen, bucket, touched)
        end
    end
end
settle(touched, gates, true)
flush()
retire_due(RETIRE_EACH + 2 * (#args - 1))
wake()
return 1
