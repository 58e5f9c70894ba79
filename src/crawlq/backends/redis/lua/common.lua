-- crawlq on Redis: helpers shared by every operation. This file heads the function library
-- (scripts.py) and runs once, when the library loads; each operation's file is the body of a
-- function that first calls `begin`, which sets what is per call (below).
--
-- Calling convention of every operation:
--   KEYS[1]  {ns}:queues   the namespace's anchor key (all keys share the hash tag {ns})
--   ARGV[1]  "{ns}:"       the key prefix
--   ARGV[2]  now           the caller's clock in seconds since the epoch, or "" for the server's
--   ARGV[3]  msgpack       the operation's arguments
-- Floats are stored with %.17g: Lua's tostring keeps 14 digits and would move times.
--
-- Keys (P is the prefix; <q> is a queue name, length-prefixed so any name is safe; <g> a group):
--   P queues            hash   queue -> msgpack {group_by, custom_key, seen}
--   P seq               string insertion counter: element ids, the last tie-break of the order
--   P limits            hash   glob -> msgpack {lua pattern, specificity a, specificity b,
--                                                concurrency or false, interval}: the rules
--                              with a wildcard
--   P lx                hash   the same for exact rules (`is_exact`), found by group name
--   P lo                hash   glob -> "operator" if an operator set its rule (none: the app)
--   P cd                hash   group -> its host's robots.txt Crawl-delay in seconds, a floor
--                              under the interval its rule gives it (`resolve`)
--   P busy              zset   groups with queued or running elements, score
--                              -(running * 2^32 + queued): busiest first, then by name
--   P g:<g>             hash   c concurrency (absent: unlimited), i interval, q queued,
--                              r running, ls last start, bu blocked until, br block reason,
--                              w how many queues have its row waiting (in their fw)
--   P leases            zset   "<#q>:<q><field>" by lease expiry, every queue
--   P sent              hash   group -> the time reserved for its latest request (reserve_send)
--   P idle              zset   groups left with nothing queued or running (and send
--                              reservations of hosts without a group), by when nothing of them
--                              needs keeping (`retire`)
--   P ra:<origin>       string what a worker made of the origin's robots.txt: its time (an
--                              8-byte big-endian double, the caller's clock) then the answer;
--                              expires a second after its time (backend.py, not the scripts)
--   P workers           hash   worker id -> msgpack {host, pid, queues, started, heartbeat, wake}
--   P w:<worker>        set    the lease members ("<#q>:<q><field>") of the elements it holds
--   P wake:<q>          pubsub channel: something became claimable in queue <q>, or due sooner
--   P gn                hash   group number -> group name; P g:<g> holds the number as `id`
--   P gseq              string the last group number given
--   P q:<#q>:<q>:e:<b>  hash   field -> msgpack element record (see REC below), in buckets that
--                              grow with the queue (see eb and `records`), so each stays a small
--                              listpack. An element's field is a 6-byte digest of its key; the
--                              rare key whose digest another key holds gets digest .. key, and
--                              the digest joins ec
--   P q:<#q>:<q>:eb     hash   the buckets' linear hashing: l level, s the next bucket to split;
--                              c how many digests ec holds (0: no lookup needs it)
--   P q:<#q>:<q>:ec     set    digests shared by more than one key (see e:<b>)
--   P q:<#q>:<q>:n      hash   0 delayed, 1 ready, 2 running, 3 dead -> count
--   P q:<#q>:<q>:d      zset   delayed fields by due time
--   P q:<#q>:<q>:r:<g>  zset   the (queue, group) sub-queue of ready elements: score -priority,
--                              member RANK .. field (RANK: due in microseconds, then id, as
--                              big-endian integers, which sort bytewise: see `rank`), so equal
--                              priorities order by due time, then insertion
--   P q:<#q>:<q>:fa     zset   frontier, active rows: score -priority of the head, member
--                              head RANK .. group
--   P q:<#q>:<q>:fw     zset   frontier, waiting rows: group by gate (when the group admits a start)
--   P q:<#q>:<q>:fr     hash   group -> its active member in fa, or "" while waiting in fw
--   P q:<#q>:<q>:x      hash   dead letters: key -> msgpack {payload, group, attempts, error,
--                              traceback, died_at, digest as hex, history, priority}
--   P q:<#q>:<q>:xo     zset   dead keys by time of death
--   P q:<#q>:<q>:s:<b>  set    seen: 64-bit digests of finished keys, in 2^18 buckets so each
--                              stays a compact intset (8 bytes an entry)

-- Per call, set by `begin`: the key prefix and the time of the call.
local P, NOW
local NEVER = 1e300
-- Seconds an idle group is kept at least after its last start and its last send reservation:
-- an interval raised meanwhile (an operator's rule, a Crawl-delay) still counts from them, as
-- it does on SQLite, and so does a gap longer than the interval asked of reserve_send.
local RETIRE_AFTER = 60
-- Idle groups whose time came that a call retires at most (`retire_due`): a settle call this
-- many and two more for each element it settles (each may have emptied a group), so the idle
-- set drains faster than it fills; a claim that found nothing to take (a quiet moment, every
-- MAX_IDLE at least for an idle worker) RETIRE_QUIET.
local RETIRE_EACH = 16
local RETIRE_QUIET = 256
local DELAYED, READY, RUNNING, DEAD = 0, 1, 2, 3
-- REC: the fields of an element record, a msgpack array (false where SQL has NULL). Stored
-- compactly (`encode`): GROUP as the group's number, KEY without the group's name where it holds
-- it (a URL holds its host) and KEY_AT where that was (or, for a URL, without its scheme too:
-- see KEY_HEADS), PAYLOAD false when it is the key, PRIORITY and ATTEMPTS false when 0, and
-- the falses at the end left off: the fields most often false come last.
-- NEXT_DUE, NEXT_PRIORITY and NEXT_PAYLOAD: a schedule that came while the element ran, to
-- queue it with once the run ends (`requeue`), all false when none did. NEXT_PAYLOAD is false
-- when that schedule's payload is the running one's (or none came), true when it is the key
-- (PAYLOAD false), else the payload; last, so records stored before it read as false.
local ID, GROUP, DUE, STATE, KEY, KEY_AT, PAYLOAD, PRIORITY, ATTEMPTS, LEASE, WORKER, NEXT_DUE,
      NEXT_PRIORITY, ERROR, HISTORY, NEXT_PAYLOAD = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
      15, 16
local REC_SIZE = 16
-- A queue's records fill buckets of about this many on average: each key costs Redis ~90 bytes,
-- and a lookup scans its bucket (a listpack), so the buckets grow in number with the queue
-- (linear hashing) and keep both small. Fixed, 32,768 buckets cost 29 bytes an element at
-- 100,000 elements, and 8,192 made a claim at 1,000,000 elements 23% slower (122 a bucket).
local RECORDS_PER_BUCKET = 32
-- HISTORY, once the element ran: its last attempts, {attempt, claimed at, worker, outcome or
-- false while running}, at most HISTORY_SIZE.
local HISTORY_SIZE = 10
-- An element's place among equal priorities (`rank`): its due time in whole microseconds
-- (7 bytes), then its insertion number (6 bytes), big-endian so that bytes sort as numbers.
local RANK_SIZE = 13
local RANK_DUE_MAX = 72057594037  -- seconds: 2^56 microseconds, the year 4253

local function fmt(x)
    return string.format('%.17g', x)
end

-- NOW as stored, formatted once a call: a claim writes and compares it several times.
local now_text

local function fmt_now()
    if now_text == nil then now_text = fmt(NOW) end
    return now_text
end

-- Each queue's key prefix, built once a call: a call builds ten or more keys of one queue,
-- and turning its length into text costs more than the rest of the name.
local queue_prefixes

local function qkey(queue, kind)
    local prefix = queue_prefixes[queue]
    if prefix == nil then
        prefix = P .. 'q:' .. #queue .. ':' .. queue .. ':'
        queue_prefixes[queue] = prefix
    end
    return prefix .. kind
end

local function gkey(group)
    return P .. 'g:' .. group
end

local function lease_member(queue, field)
    return #queue .. ':' .. queue .. field
end

local function split_lease_member(member)
    local colon = string.find(member, ':', 1, true)
    local n = tonumber(string.sub(member, 1, colon - 1))
    return string.sub(member, colon + 1, colon + n), string.sub(member, colon + n + 1)
end

local function rank(rec)
    local due = rec[DUE]
    if due < 0 then due = 0 elseif due > RANK_DUE_MAX then due = RANK_DUE_MAX end
    return struct.pack('>I7', math.floor(due * 1e6)) .. struct.pack('>I6', rec[ID])
end

-- Bytewise order, as Redis orders members (Lua's < follows the server's locale).
local function before(a, b)
    for i = 1, math.min(#a, #b) do
        local x, y = string.byte(a, i), string.byte(b, i)
        if x ~= y then return x < y end
    end
    return #a < #b
end

-- Dead letters keep the digest as hex (msgpack strings read back as text); calls send it raw.
local function hex_digest(raw)
    return (string.gsub(raw, '.', function(c) return string.format('%02x', string.byte(c)) end))
end

local function raw_digest(hex)
    return (string.gsub(hex, '..', function(cc) return string.char(tonumber(cc, 16)) end))
end

-- -- element records ------------------------------------------------------------------------

-- Linear hashing: a queue's 2^level + split buckets; the field's first four bytes, h, pick
-- bucket h mod 2^level, or h mod 2^(level + 1) where that bucket was split already. Read once
-- a call per queue: {level, split}.
local bucket_states

local function bucket_state(queue)
    local state = bucket_states[queue]
    if state == nil then
        local stored = redis.call('HMGET', qkey(queue, 'eb'), 'l', 's', 'c')
        state = {tonumber(stored[1]) or 0, tonumber(stored[2]) or 0,
                 collisions = tonumber(stored[3]) or 0}
        bucket_states[queue] = state
    end
    return state
end

local function field_hash(field)
    local a, b, c, d = string.byte(field, 1, 4)
    return ((a * 256 + b) * 256 + c) * 256 + d
end

local function bucket_of(h, state)
    local low = 2 ^ state[1]
    local bucket = h % low
    if bucket < state[2] then bucket = h % (2 * low) end
    return bucket
end

-- The hash holding the record of `field`.
local function records(queue, field)
    return qkey(queue, 'e:' .. bucket_of(field_hash(field), bucket_state(queue)))
end

-- Group numbers, both ways, read once a call.
local group_ids, group_names

local function note_group(group, id)
    group_ids[group], group_names[id] = id, group
end

-- The group's number; nil while it has none (`ensure_group` gives it one).
local function group_id(group)
    local id = group_ids[group]
    if id == nil then
        id = tonumber(redis.call('HGET', gkey(group), 'id'))
        if id then note_group(group, id) end
    end
    return id
end

local function group_name(id)
    local name = group_names[id]
    if name == nil then
        name = redis.call('HGET', P .. 'gn', id)
        note_group(name, id)
    end
    return name
end

-- What a key most often holds before its group's name: a URL's scheme, in a JSON string.
-- Such a key is stored as what follows the name, without the closing quote, and KEY_AT as
-- minus the head's number here: 10 bytes less a URL than keeping the scheme and quotes.
local KEY_HEADS = {'"https://', '"http://'}
local HEAD_NUMBERS = {['"https://'] = 1, ['"http://'] = 2}
local QUOTE = 34  -- '"'

local function encode(rec)
    -- The REC_SIZE fields in one table made at once: filled field by field, it grew five times.
    local stored = {rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], rec[8], rec[9],
                    rec[10], rec[11], rec[12], rec[13], rec[14], rec[15], rec[16]}
    local group, key = rec[GROUP], rec[KEY]
    stored[GROUP], stored[KEY_AT] = group_id(group), false
    if stored[PRIORITY] == 0 then stored[PRIORITY] = false end
    if stored[ATTEMPTS] == 0 then stored[ATTEMPTS] = false end
    local at = group ~= '' and string.find(key, group, 1, true)
    if at then
        local head = HEAD_NUMBERS[string.sub(key, 1, at - 1)]
        if head and string.byte(key, -1) == QUOTE and #key > at + #group - 1 then
            stored[KEY] = string.sub(key, at + #group, -2)
            stored[KEY_AT] = -head
        else
            stored[KEY] = string.sub(key, 1, at - 1) .. string.sub(key, at + #group)
            stored[KEY_AT] = at
        end
    end
    for i = REC_SIZE, KEY_AT, -1 do
        if stored[i] then break end
        stored[i] = nil
    end
    return cmsgpack.pack(stored)
end

local function decode(raw)
    local rec = cmsgpack.unpack(raw)
    for i = #rec + 1, REC_SIZE do rec[i] = false end
    rec[PRIORITY], rec[ATTEMPTS] = rec[PRIORITY] or 0, rec[ATTEMPTS] or 0
    local group = group_name(rec[GROUP])
    local at = rec[KEY_AT]
    if at and at < 0 then
        rec[KEY] = KEY_HEADS[-at] .. group .. rec[KEY] .. '"'
    elseif at then
        rec[KEY] = string.sub(rec[KEY], 1, at - 1) .. group .. string.sub(rec[KEY], at)
    end
    rec[GROUP], rec[KEY_AT] = group, false
    return rec
end

local function load(queue, field)
    local raw = redis.call('HGET', records(queue, field), field)
    if raw then return decode(raw) end
    return nil
end

-- The element of `key` and its field; when absent, nil and the field a new one would take.
local function find(queue, key, digest)
    local raw = redis.call('HGET', records(queue, digest), digest)
    local taken = false
    if raw then
        local rec = decode(raw)
        if rec[KEY] == key then return rec, digest end
        taken = true
    elseif bucket_state(queue).collisions == 0
            or redis.call('SISMEMBER', qkey(queue, 'ec'), digest) == 0 then
        return nil, digest
    end
    local long = digest .. key
    local rec = load(queue, long)
    if rec then return rec, long end
    return nil, taken and long or digest
end

-- A call's lease is still the element's: the same element, attempt and claim time (the
-- attempts start afresh when an element is scheduled again while it runs, so the attempt
-- alone can match a later run).
local function holds(rec, id, attempt, claimed_at)
    if not rec or rec[ID] ~= id or rec[ATTEMPTS] ~= attempt then return false end
    local history = rec[HISTORY]
    local last = history and history[#history]
    return not last or last[2] == claimed_at
end

local function save(queue, field, rec)
    redis.call('HSET', records(queue, field), field, encode(rec))
end

-- Counters change many times in a call: the deltas add up here and reach Redis once, in
-- `flush` (every operation that counts calls it last). `gate` reads a group's running count
-- through `pending` so it sees the deltas too.
local deltas = {}
local function add(key, field, delta)
    local fields = deltas[key]
    if fields == nil then
        fields = {}
        deltas[key] = fields
    end
    fields[field] = (fields[field] or 0) + delta
end

local function pending(key, field)
    local fields = deltas[key]
    return fields and fields[field] or 0
end

local function count(queue, state, delta)
    add(qkey(queue, 'n'), state, delta)
end

-- Group counters: queued (delayed or ready), running, waiting rows. The "" group keeps none.
local function group_count(group, field, delta)
    if group ~= '' then add(gkey(group), field, delta) end
end

-- Lease set and worker set changes, applied in bulk by `flush` too (nothing reads them before).
local lease_adds, lease_removals = {}, {}
local held_adds, held_removals = {}, {}  -- worker -> lease members

local function hold(by_worker, worker, member)
    local members = by_worker[worker]
    if members == nil then
        members = {}
        by_worker[worker] = members
    end
    table.insert(members, member)
end

local function apply_chunked(command, key, members)
    for i = 1, #members, 1000 do
        redis.call(command, key, unpack(members, i, math.min(i + 999, #members)))
    end
end

local GROUP_PREFIX

-- Group key -> {queued, running} as stored, for the groups a call read them of: `flush` then
-- writes their new values at once instead of adding and reading them back.
local counted

local function known_counts(group, queued, running)
    counted[gkey(group)] = {queued, running}
end

-- Group key -> true for the groups that started elements at NOW (a claim's): `flush` writes
-- that as their last start (ls), in the HSET of their counts (one command less a claim), and
-- `gate` reads it from here until then.
local started_now

local function note_start(group)
    started_now[gkey(group)] = true
end

-- The group's last start: NOW if it started this call, else as stored (text or nil).
local function last_start(group, stored)
    if started_now[gkey(group)] then return NOW end
    return tonumber(stored)
end

-- Groups whose counts fell to nothing this call: `flush` retires them.
local emptied

-- A group left with nothing queued or running is forgotten (its hash, number and send
-- reservation) once nothing of it needs keeping: its block is past, and its interval, at
-- least RETIRE_AFTER, since its last start and its last send reservation. Until then it waits
-- in P idle (`retire_due`). A crawl meets millions
-- of hosts once each: kept, each cost Redis ~280 bytes for good. Rules and Crawl-delays stay:
-- the group is resolved again if work for it comes back.
local function retire(group)
    local key = gkey(group)
    local g = redis.call('HMGET', key, 'id', 'q', 'r', 'w', 'i', 'ls', 'bu')
    if not g[1] then  -- no group: the send reservation of a host without elements, due
        redis.call('HDEL', P .. 'sent', group)
        return
    end
    if (tonumber(g[2]) or 0) + (tonumber(g[3]) or 0) + (tonumber(g[4]) or 0) > 0 then return end
    local interval = tonumber(g[5]) or 0
    local sent = tonumber(redis.call('HGET', P .. 'sent', group))
    local kept_for = math.max(interval, RETIRE_AFTER)
    local started = tonumber(g[6])
    local free_at = math.max(started and started + kept_for or 0, tonumber(g[7]) or 0,
                             sent and sent + kept_for or 0)
    if free_at > NOW then
        redis.call('ZADD', P .. 'idle', 'GT', fmt(free_at), group)
        return
    end
    redis.call('DEL', key)
    redis.call('HDEL', P .. 'gn', g[1])
    if sent then redis.call('HDEL', P .. 'sent', group) end
    group_ids[group], group_names[tonumber(g[1])] = nil, nil
end

local function flush()
    for key, fields in pairs(deltas) do
        local known = counted[key]
        local queued, running
        if known then
            queued, running = known[1] + (fields.q or 0), known[2] + (fields.r or 0)
            if started_now[key] then
                redis.call('HSET', key, 'q', queued, 'r', running, 'ls', fmt_now())
                started_now[key] = nil
            else
                redis.call('HSET', key, 'q', queued, 'r', running)
            end
        end
        for field, delta in pairs(fields) do
            if delta ~= 0 and not (known and (field == 'q' or field == 'r')) then
                redis.call('HINCRBY', key, field, delta)
            end
        end
        if string.sub(key, 1, #GROUP_PREFIX) == GROUP_PREFIX then
            local group = string.sub(key, #GROUP_PREFIX + 1)
            local busy = P .. 'busy'
            if known then
                if queued + running > 0 then
                    redis.call('ZADD', busy, -(running * 4294967296 + queued), group)
                else
                    redis.call('ZREM', busy, group)
                    emptied[group] = true
                end
            else  -- the score moves by the deltas: no need to read the counts back
                local delta = (fields.r or 0) * 4294967296 + (fields.q or 0)
                if delta ~= 0 and tonumber(redis.call('ZINCRBY', busy, -delta, group)) == 0 then
                    redis.call('ZREM', busy, group)
                    emptied[group] = true
                end
            end
        end
    end
    deltas, counted = {}, {}
    -- Starts of groups whose counts were not read (none in a claim as it stands).
    for key, _ in pairs(started_now) do redis.call('HSET', key, 'ls', fmt_now()) end
    started_now = {}
    apply_chunked('ZREM', P .. 'leases', lease_removals)
    apply_chunked('ZADD', P .. 'leases', lease_adds)  -- score, member pairs: chunks stay even
    lease_adds, lease_removals = {}, {}
    for worker, members in pairs(held_removals) do apply_chunked('SREM', P .. 'w:' .. worker, members) end
    for worker, members in pairs(held_adds) do apply_chunked('SADD', P .. 'w:' .. worker, members) end
    held_adds, held_removals = {}, {}
    for group, _ in pairs(emptied) do retire(group) end
    emptied = {}
end

-- Up to `most` of the groups `retire` noted for later whose time has come: retired now.
local function retire_due(most)
    local idle = P .. 'idle'
    for _, group in ipairs(redis.call('ZRANGE', idle, '-inf', fmt_now(), 'BYSCORE', 'LIMIT', 0, most)) do
        redis.call('ZREM', idle, group)
        retire(group)
    end
end

local queue_names = nil
local function all_queues()
    if queue_names == nil then queue_names = redis.call('HKEYS', P .. 'queues') end
    return queue_names
end

local queue_configs = {}
local function queue_config(queue)
    local config = queue_configs[queue]
    if config == nil then
        local raw = redis.call('HGET', P .. 'queues', queue)
        config = raw and cmsgpack.unpack(raw) or false
        queue_configs[queue] = config
    end
    return config
end

-- -- limits --------------------------------------------------------------------------------

local limit_rules = nil
-- Whether a limit pattern matches one name only, itself (limits.is_exact): such rules, one a
-- host, are kept in `lx` and found by name, the globs in `limits` scanned.
local function is_exact(pattern)
    return not string.find(pattern, '[%*%?%[]')
end

local function resolve(group)
    if limit_rules == nil then
        limit_rules = {}
        local flat = redis.call('HGETALL', P .. 'limits')
        for i = 1, #flat, 2 do
            local rule = cmsgpack.unpack(flat[i + 1])
            rule.glob = flat[i]
            table.insert(limit_rules, rule)
        end
        table.sort(limit_rules, function(a, b) return before(a.glob, b.glob) end)
    end
    local best = nil
    if is_exact(group) then
        local own = redis.call('HGET', P .. 'lx', group)
        if own then best = cmsgpack.unpack(own) end
    end
    for _, rule in ipairs(limit_rules) do
        if string.find(group, rule[1]) and (best == nil or rule[2] > best[2]
                or (rule[2] == best[2] and rule[3] > best[3])) then
            best = rule
        end
    end
    local concurrency, interval = 4, 0
    if best then concurrency, interval = best[4], best[5] end
    local floor = tonumber(redis.call('HGET', P .. 'cd', group))
    if floor and floor > interval then interval = floor end
    return concurrency, interval
end

-- The group's limits follow the rules and Crawl-delays stored now; `gates` notes it if they
-- changed (its rows then move: `settle`).
local function follow_limits(group, gates)
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

-- A group is known once it has a number (`group_id` then finds it in this call's cache).
local function ensure_group(group)
    if group_id(group) then return end
    local concurrency, interval = resolve(group)
    local id = redis.call('INCR', P .. 'gseq')
    note_group(group, id)
    redis.call('HSET', P .. 'gn', id, group)
    if concurrency then
        redis.call('HSET', gkey(group), 'id', id, 'c', concurrency, 'i', fmt(interval))
    else
        redis.call('HSET', gkey(group), 'id', id, 'i', fmt(interval))
    end
end

-- -- the frontier ------------------------------------------------------------------------------

-- When the group next admits a start: never while full, else after its interval and any block.
local function gate(group)
    if group == '' then return 0 end
    local g = redis.call('HMGET', gkey(group), 'c', 'i', 'r', 'ls', 'bu')
    local concurrency = tonumber(g[1])
    local running = (tonumber(g[3]) or 0) + pending(gkey(group), 'r')
    if concurrency and running >= concurrency then return NEVER end
    local t = 0
    local last = last_start(group, g[4])
    if last then t = last + (tonumber(g[2]) or 0) end
    local blocked = tonumber(g[5])
    if blocked and blocked > t then t = blocked end
    return t
end

-- Puts the (queue, group) row where it belongs: active with its head, waiting for its gate,
-- or gone when the sub-queue is empty. `old`, the row as the caller read it (false: none),
-- and `head`, the sub-queue's {head member, score}, are read here unless given.
local function refresh_pair(queue, group, old, head)
    local rows, active, waiting = qkey(queue, 'fr'), qkey(queue, 'fa'), qkey(queue, 'fw')
    if old == nil then old = redis.call('HGET', rows, group) end
    head = head or redis.call('ZRANGE', qkey(queue, 'r:' .. group), 0, 0, 'WITHSCORES')
    if old and old ~= '' then redis.call('ZREM', active, old) end
    if head[1] == nil then
        if old then
            redis.call('HDEL', rows, group)
            redis.call('ZREM', waiting, group)
            if old == '' then group_count(group, 'w', -1) end
        end
        return
    end
    local at = gate(group)
    if at <= NOW then
        local member = string.sub(head[1], 1, RANK_SIZE) .. group
        redis.call('ZADD', active, head[2], member)
        redis.call('HSET', rows, group, member)
        if old == '' then
            redis.call('ZREM', waiting, group)
            group_count(group, 'w', -1)
        end
    else
        redis.call('ZADD', waiting, fmt(at), group)
        if old ~= '' then
            redis.call('HSET', rows, group, '')
            group_count(group, 'w', 1)
        end
    end
end

-- A (queue, group) sub-queue changed but the group's gate did not: only an active row's head
-- can have moved, or the sub-queue emptied. A waiting row that still has elements waits for
-- its gate, and the claim reads its head when the gate passes (so a schedule into a busy group
-- costs three reads, not a rewrite of its row). `head`: the sub-queue's {head member, score}
-- when the caller knows it (then the sub-queue is not empty), else read here.
local function refresh_head(queue, group, head)
    local old = redis.call('HGET', qkey(queue, 'fr'), group)
    if old == '' then
        if head or redis.call('EXISTS', qkey(queue, 'r:' .. group)) == 1 then return end
        refresh_pair(queue, group, old)
        return
    end
    if old then
        head = head or redis.call('ZRANGE', qkey(queue, 'r:' .. group), 0, 0, 'WITHSCORES')
        if head[1] and string.sub(head[1], 1, RANK_SIZE) .. group == old
                and tonumber(redis.call('ZSCORE', qkey(queue, 'fa'), old)) == tonumber(head[2]) then
            return
        end
    end
    refresh_pair(queue, group, old, head)
end

-- The group's running count, start, limits or block changed: every row of it follows.
-- Returns the queues that have a row of it, i.e. those whose workers may care. A gate that
-- only `opened` (a slot freed) changes nothing for active rows, so a group with no waiting
-- row (its `w` count, over every queue) is done without looking at any queue.
local function refresh_gate(group, opened)
    local queues = {}
    if group == '' then return queues end
    if opened then
        local g = gkey(group)
        if (tonumber(redis.call('HGET', g, 'w')) or 0) + pending(g, 'w') == 0 then return queues end
    end
    for _, queue in ipairs(all_queues()) do
        if redis.call('HEXISTS', qkey(queue, 'fr'), group) == 1 then
            refresh_pair(queue, group)
            table.insert(queues, queue)
        end
    end
    return queues
end

-- Queues whose idle workers a call wakes as it ends (`wake`): set of queue names.
local woken

-- touched: set of "<#q>:<q><group>" -> {queue, group, added = the member of a new element,
-- score = its score, moved = whether anything else (or more) changed in that sub-queue};
-- gates: set of groups.
local function touch(touched, queue, group, added, score)
    local name = lease_member(queue, group)
    local pair = touched[name]
    if pair == nil then
        touched[name] = {queue, group, added = added, score = score, moved = not added}
    else
        pair.moved = true
    end
end

-- A touched sub-queue's row follows it. When all that changed is one new element and it did
-- not become the head, the row (active or waiting) already stands: one ZRANK. When it did
-- (a new group's first element, say), the head is known and not read again.
local function refresh_touched(pair)
    local head
    if not pair.moved then
        local at = redis.call('ZRANK', qkey(pair[1], 'r:' .. pair[2]), pair.added)
        if at and at > 0 then return end
        if at == 0 then head = {pair.added, pair.score} end
    end
    refresh_head(pair[1], pair[2], head)
end

-- Sub-queues changed and groups' gates moved (`opened`: only by freed slots): their rows
-- follow, and their queues' workers are woken.
local function settle(touched, gates, opened)
    for group, _ in pairs(gates) do
        for _, queue in ipairs(refresh_gate(group, opened)) do woken[queue] = true end
    end
    for _, pair in pairs(touched) do
        refresh_touched(pair)
        woken[pair[1]] = true
    end
end

-- Every call that may make work claimable ends here: one message per woken queue.
local function wake()
    for queue, _ in pairs(woken) do redis.call('PUBLISH', P .. 'wake:' .. queue, '1') end
end

-- -- element placement -----------------------------------------------------------------------
-- These take an element's field (see `find`), not its key.

-- Puts a queued element where its state says: the delayed set or its sub-queue (`added`: a
-- new element, see `refresh_touched`).
local function place(queue, field, rec, touched, added)
    if rec[DUE] > NOW then
        rec[STATE] = DELAYED
        redis.call('ZADD', qkey(queue, 'd'), fmt(rec[DUE]), field)
    else
        rec[STATE] = READY
        local member = rank(rec) .. field
        redis.call('ZADD', qkey(queue, 'r:' .. rec[GROUP]), -rec[PRIORITY], member)
        touch(touched, queue, rec[GROUP], added and member, -rec[PRIORITY])
    end
    count(queue, rec[STATE], 1)
end

-- Takes a queued or running element out of its place (the record itself stays).
local function unplace(queue, field, rec, touched)
    local state = rec[STATE]
    if state == DELAYED then
        redis.call('ZREM', qkey(queue, 'd'), field)
    elseif state == READY then
        redis.call('ZREM', qkey(queue, 'r:' .. rec[GROUP]), rank(rec) .. field)
        touch(touched, queue, rec[GROUP])
    elseif state == RUNNING then
        table.insert(lease_removals, lease_member(queue, field))
        if rec[WORKER] then hold(held_removals, rec[WORKER], lease_member(queue, field)) end
        rec[LEASE], rec[WORKER] = false, false
    end
    count(queue, state, -1)
end

-- The run that just ended, in the history: how it ended (kept if already said).
local function set_outcome(rec, outcome)
    local history = rec[HISTORY]
    if history and #history > 0 and not history[#history][4] then
        history[#history][4] = outcome
    end
end

-- Back to the queue from a run: at `due` (false keeps its own), or at the schedule that
-- arrived while it ran, with its priority and payload, which also starts its attempts afresh.
local function requeue(queue, field, rec, due, attempts_delta, err, touched)
    set_outcome(rec, err or 'released')
    unplace(queue, field, rec, touched)
    group_count(rec[GROUP], 'r', -1)
    group_count(rec[GROUP], 'q', 1)
    if rec[NEXT_DUE] then
        rec[DUE], rec[PRIORITY], rec[ATTEMPTS] = rec[NEXT_DUE], rec[NEXT_PRIORITY], 0
        local payload = rec[NEXT_PAYLOAD]
        if payload == true then rec[PAYLOAD] = false elseif payload then rec[PAYLOAD] = payload end
        rec[NEXT_DUE], rec[NEXT_PRIORITY], rec[NEXT_PAYLOAD] = false, false, false
    else
        if due then rec[DUE] = due end
        rec[ATTEMPTS] = rec[ATTEMPTS] + attempts_delta
    end
    if err then rec[ERROR] = err end
    place(queue, field, rec, touched)
    save(queue, field, rec)
end

-- `seen` holds the signed 64-bit digest in decimal, so each bucket stays an intset.
local function remember_seen(queue, seen_digest, bucket)
    if queue_config(queue)[3] then
        redis.call('SADD', qkey(queue, 's:' .. bucket), seen_digest)
    end
end

-- Done with an element: queued afresh if scheduled while running, else removed.
local function finish(queue, field, rec, seen_digest, bucket, touched)
    remember_seen(queue, seen_digest, bucket)
    if rec[STATE] == RUNNING and rec[NEXT_DUE] then
        rec[ERROR] = false
        set_outcome(rec, 'done, scheduled again')
        requeue(queue, field, rec, false, 0, false, touched)
        return
    end
    unplace(queue, field, rec, touched)
    group_count(rec[GROUP], rec[STATE] == RUNNING and 'r' or 'q', -1)
    redis.call('HDEL', records(queue, field), field)
end

-- A record was added: one more bucket once the queue holds more than RECORDS_PER_BUCKET a
-- bucket, the next one to split giving the new one the records that now hash there.
local function grow(queue)
    local state = bucket_state(queue)
    if state[3] then
        state[3] = state[3] + 1
    else  -- how many records the queue holds, this one included (its count is pending)
        local n = qkey(queue, 'n')
        local stored = redis.call('HMGET', n, DELAYED, READY, RUNNING)
        state[3] = (tonumber(stored[1]) or 0) + (tonumber(stored[2]) or 0)
            + (tonumber(stored[3]) or 0) + pending(n, DELAYED) + pending(n, READY)
            + pending(n, RUNNING)
    end
    local low = 2 ^ state[1]
    if state[3] <= (low + state[2]) * RECORDS_PER_BUCKET then return end
    local from = qkey(queue, 'e:' .. state[2])
    local to = qkey(queue, 'e:' .. (state[2] + low))
    local flat = redis.call('HGETALL', from)
    local moved, names = {}, {}
    for i = 1, #flat, 2 do
        if field_hash(flat[i]) % (2 * low) ~= state[2] then
            table.insert(moved, flat[i])
            table.insert(moved, flat[i + 1])
            table.insert(names, flat[i])
        end
    end
    if #names > 0 then
        redis.call('HSET', to, unpack(moved))
        redis.call('HDEL', from, unpack(names))
    end
    state[2] = state[2] + 1
    if state[2] == low then state[1], state[2] = state[1] + 1, 0 end
    redis.call('HSET', qkey(queue, 'eb'), 'l', state[1], 's', state[2])
end

-- -- schedule ----------------------------------------------------------------------------------

local ADDED, MOVED, KEPT, DEFERRED, SKIPPED = 1, 2, 3, 4, 5
local OVERWRITE, ONLY_IF_EARLIER = 0, 1

-- Queues with dead letters, as this call found them: {[queue] = bool}.
local dead_queues

-- A dead element scheduled anew is alive again: its dead letter goes, as `dead` takes it out.
local function revive(queue, key)
    local dead = qkey(queue, 'x')
    if dead_queues[queue] == nil then dead_queues[queue] = redis.call('EXISTS', dead) == 1 end
    if dead_queues[queue] and redis.call('HDEL', dead, key) == 1 then
        redis.call('ZREM', qkey(queue, 'xo'), key)
        count(queue, DEAD, -1)
    end
end

-- One schedule: {queue, key, payload or false, group, due, priority, mode, digest (6 bytes),
-- seen digest, seen bucket, revisit}; a queue with `seen` skips keys it finished unless asked
-- to revisit them. Returns what happened (ADDED ... SKIPPED).
local function apply(item, touched)
    local queue, key, payload, group, due, priority, mode = unpack(item, 1, 7)
    local digest = item[8]
    local rec, field = find(queue, key, digest)
    if rec == nil then
        if queue_config(queue)[3] and not item[11]
                and redis.call('SISMEMBER', qkey(queue, 's:' .. item[10]), item[9]) == 1 then
            return SKIPPED
        end
        ensure_group(group)
        if field ~= digest and redis.call('SADD', qkey(queue, 'ec'), digest) == 1 then
            redis.call('HINCRBY', qkey(queue, 'eb'), 'c', 1)
            bucket_state(queue).collisions = bucket_state(queue).collisions + 1
        end
        -- ID, GROUP, DUE, STATE, KEY, KEY_AT, PAYLOAD, PRIORITY, ATTEMPTS, then all false
        rec = {redis.call('INCR', P .. 'seq'), group, due, READY, key, false, payload, priority, 0,
               false, false, false, false, false, false, false}
        place(queue, field, rec, touched, true)
        group_count(group, 'q', 1)
        save(queue, field, rec)
        grow(queue)
        revive(queue, key)
        woken[queue] = true
        return ADDED
    end
    if rec[STATE] == RUNNING then
        if mode == OVERWRITE or (mode == ONLY_IF_EARLIER
                and (not rec[NEXT_DUE] or due < rec[NEXT_DUE])) then
            rec[NEXT_DUE], rec[NEXT_PRIORITY] = due, priority
            if payload == rec[PAYLOAD] then  -- the running one's (false: the key, for both)
                rec[NEXT_PAYLOAD] = false
            else
                rec[NEXT_PAYLOAD] = payload or true
            end
            save(queue, field, rec)
            return DEFERRED
        end
        return KEPT
    end
    if mode == OVERWRITE or (mode == ONLY_IF_EARLIER and due < rec[DUE]) then
        unplace(queue, field, rec, touched)
        if group ~= rec[GROUP] then
            ensure_group(group)
            group_count(rec[GROUP], 'q', -1)
            group_count(group, 'q', 1)
        end
        rec[PAYLOAD], rec[GROUP], rec[DUE], rec[PRIORITY] = payload, group, due, priority
        -- A new schedule starts its attempts afresh (as one made while it ran does): a run
        -- whose lease expired before it then acks too late to finish it.
        rec[ATTEMPTS] = 0
        place(queue, field, rec, touched)
        save(queue, field, rec)
        woken[queue] = true
        return MOVED
    end
    return KEPT
end

-- -- a call ----------------------------------------------------------------------------------

-- The library's locals outlive a call: whatever a call may change or cache starts afresh here.
local function begin(ARGV)
    P = ARGV[1]
    -- Without a clock from the caller, the server's: one time for every machine.
    NOW = tonumber(ARGV[2])
    if NOW == nil then
        local t = redis.call('TIME')
        NOW = tonumber(t[1]) + tonumber(t[2]) / 1e6
    end
    GROUP_PREFIX = P .. 'g:'
    group_ids, group_names, bucket_states, woken, emptied = {[''] = 0}, {[0] = ''}, {}, {}, {}
    queue_prefixes, now_text, started_now = {}, nil, {}
    deltas, counted, lease_adds, lease_removals, held_adds, held_removals = {}, {}, {}, {}, {}, {}
    queue_names, queue_configs, limit_rules, dead_queues = nil, {}, nil, {}
end
