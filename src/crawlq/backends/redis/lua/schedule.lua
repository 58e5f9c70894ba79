-- schedule: adds or moves a batch of elements in one step (SPEC 3.1, 3.2).
-- ARGV[3]: msgpack list of items (see `apply` in common.lua), each (queue, key) once: the
--          caller folds repeats.
-- Returns msgpack {added, moved, kept, deferred, skipped}, or {false, queue} when a queue is
-- unknown, before anything changed.
local items = cmsgpack.unpack(ARGV[3])
for _, item in ipairs(items) do
    if not queue_config(item[1]) then return cmsgpack.pack({false, item[1]}) end
end
local outcomes = {0, 0, 0, 0, 0}
local touched = {}
for _, item in ipairs(items) do
    local outcome = apply(item, touched)
    outcomes[outcome] = outcomes[outcome] + 1
end
settle(touched, {})
flush()
wake()
return cmsgpack.pack(outcomes)
