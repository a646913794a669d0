"""The Lua scripts a sequence step runs on the cluster store: ARRIVE (a ticket, liveness and the
lease with the state when the step's turn has come: round trip one), TRY (a waiting step asks
again), RENEW (a long step keeps its lease), FINISH (write-back and release: round trip two)
and SETTLE (after a step whose outcome its replica never learnt: applied, or never to be).
docs/deployment.md ("Sequences on any replica") describes the keys; every script takes the
same eight:

    KEYS[1] seq:<model>:<version>:<id>       hash: open, gen, tickets, step, state_gen, state,
                                             version, used; last, last_fp, prev, doubt,
                                             closer; a:<token>, x:<token> (below)
    KEYS[2] seqlease:<model>:<version>:<id>  the lease: a step's random token, PX the lease
    KEYS[3] seqqueue:<model>:<version>:<id>  zset: tokens of the steps not finished, by ticket
                                             (but the one that took the lease alone)
    KEYS[4] seqclaim:<model>:<version>:<id>  zset: tokens of KEYS[3], by when their claim runs out
    KEYS[5] seqlive:<model>:<version>        zset: the model's live sequences, by idle deadline
    KEYS[6] seqall                           zset: the cluster's live sequences (KEYS[1] of
                                             each), by idle deadline: OPSERVE_MAX_SEQUENCES
    KEYS[7] seqheld                          zset: every sequence hash (KEYS[1]), by its expiry
    KEYS[8] seqbytes                         hash: the state bytes each hash keeps (its state
                                             and `prev`), by KEYS[1]; '#': their total

Bounded per cluster: a START past OPSERVE_MAX_SEQUENCES live sequences of the cluster, or with
the total of state bytes past its bound, is refused ('full'), as a write-back that would pass
that bound ('full' from FINISH: nothing written), before Redis fills. Entries of hashes that
expired leave the counts at the next START, or at a write-back they would otherwise refuse
(sweep): until then they only count high.

Cost: a step's time is mostly its two round trips, but each command a script runs costs Redis
a microsecond or more (a write some more: it is propagated to the AOF), so the uncontended
path reads each hash once (HMGET) and writes each once, and skips what it knows (ARRIVE: a
step with no other pending takes the lease at once, with no place in the order, so neither
it nor FINISH touches KEYS[3] and KEYS[4]; FINISH: the counts and the keys' state it just
wrote, and the expiries the lease's hold() set later than it needs): about 10 commands for
ARRIVE and 11 for FINISH (bench/bench_sequences.py counts them).

Times are Redis's clock (TIME), in milliseconds. While a step is pending the sequence's keys
live an idle time and a lease; once none is, an idle time: the key's expiry is the idle
release (max_sequence_idle_microseconds).

Exactly once. Every script may run twice (the store retries on a fresh connection when one
broke, a replica asks again, a command queued in a stalled Redis runs after its replica gave
up): a step's random token marks what it did. ARRIVE records `a:<token>` (the step's START
generation) and settles liveness only the first time; FINISH records the committed step's
token (`last`), its fingerprint (`last_fp`: a hash of the client's request) and the state the
step read (`prev`), and answers 'kept' again to its own replay; SETTLE marks a token whose
FINISH ran as `doubt` (its answer never reached the client) or fences one that did not (`x:`:
no script acts on it again). A client's resend (a new token, the same fingerprint) of the
last committed step is a replay: ARRIVE answers 'replay' and the state that step read, and the
replica answers by running the step again on it, writing nothing. Where a resend cannot be told
from a new step that repeats the last one exactly (no request id, nothing in doubt), it is a
new step: an END or START resend can always be told (an END on the sequence it closed, a START
whose commit is the last), a middle step's when it carries a request id or is in doubt. An
ended sequence keeps its hash (without its state) its idle time, so a late replay still finds
it."""

_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- the state bytes the sequence's hash keeps, held in the cluster's count until `deadline`
-- (`old`: the count held before, when the caller read it; `deadline` nil: the one it has,
-- known to be later)
local function held(bytes, deadline, old)
  old = old or tonumber(redis.call('HGET', KEYS[8], KEYS[1]) or '0')
  if bytes ~= old then
    redis.call('HINCRBY', KEYS[8], '#', bytes - old)
    redis.call('HSET', KEYS[8], KEYS[1], bytes)
  end
  if deadline then redis.call('ZADD', KEYS[7], deadline, KEYS[1]) end
end

local function recount(deadline)
  local bytes = 0
  if redis.call('EXISTS', KEYS[1]) == 1 then
    bytes = redis.call('HSTRLEN', KEYS[1], 'state') + redis.call('HSTRLEN', KEYS[1], 'prev')
  end
  held(bytes, deadline)
end

-- the cluster's counts without the hashes that expired (a bounded batch per call)
local function sweep(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, 256)
  for _, key in ipairs(gone) do
    local bytes = tonumber(redis.call('HGET', KEYS[8], key) or '0')
    if bytes ~= 0 then redis.call('HINCRBY', KEYS[8], '#', -bytes) end
    redis.call('HDEL', KEYS[8], key)
    redis.call('ZREM', KEYS[7], key)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
end

-- ms until the soonest of `zset`'s deadlines
local function soonest(zset, now)
  local first = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
  if not first[2] then return 1000 end
  return math.max(0, tonumber(first[2]) - now)
end

-- a step is pending: the sequence's keys and its place in the model's table stay (`alone`:
-- the only step, holding the lease with no place in the order, so there is none to keep)
local function hold(now, idle_ms, lease_ms, member, alone)
  redis.call('PEXPIRE', KEYS[1], idle_ms + lease_ms)
  if not alone then
    redis.call('PEXPIRE', KEYS[3], idle_ms + lease_ms)
    redis.call('PEXPIRE', KEYS[4], idle_ms + lease_ms)
  end
  redis.call('ZADD', KEYS[5], now + idle_ms + lease_ms, member)
  redis.call('PEXPIRE', KEYS[5], idle_ms + lease_ms)
  redis.call('ZADD', KEYS[6], now + idle_ms + lease_ms, KEYS[1])
  redis.call('ZADD', KEYS[7], now + idle_ms + lease_ms, KEYS[1])
end

-- a step's token gone from the order (finished, skipped or fenced; `alone`: it never had a
-- place in it)
local function unqueue(token, alone)
  if not alone then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  redis.call('HDEL', KEYS[1], 'a:' .. token)
end

-- 'go' (the lease taken) when `token` is the earliest ticket whose claim has not run out
-- and no other step holds the lease; earlier tickets whose claims ran out (their replica
-- died, or gave up) are skipped for good
local function acquire(token, now, lease_ms)
  if not redis.call('ZSCORE', KEYS[3], token) then return 'lost' end
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= token then return 'wait' end
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if head == token then break end
    local claim = tonumber(redis.call('ZSCORE', KEYS[4], head) or '0')
    if claim >= now then return 'wait' end
    unqueue(head)
  end
  if not holder then redis.call('SET', KEYS[2], token, 'NX', 'PX', lease_ms) end
  redis.call('ZADD', KEYS[4], now + lease_ms, token)
  return 'go'
end

local function state()
  return redis.call('HMGET', KEYS[1], 'step', 'state_gen', 'state')
end

-- after a step left: an ended sequence with no step pending keeps only what a replay needs
-- (and its state when `keep`: an END fenced before it ran, which its resend runs), an idle
-- time; one still pending stays; one idle goes at its idle deadline. `wrote`: FINISH's
-- write-back, which knows the hash exists, its open flag, the state bytes it keeps once
-- ended or not, and their count before, and has set `used`; nil: all read here. A write-back
-- held the lease, so the hold() that took or renewed it (less than a lease ago) left KEYS[5]'s
-- expiry and KEYS[7]'s score past now + idle: they stay (KEYS[7] may then count the hash's
-- bytes up to a lease longer than it lives: high, never low).
local function rest(now, idle_ms, lease_ms, member, keep, wrote)
  local open
  if wrote then
    open = wrote.open
  else
    if redis.call('EXISTS', KEYS[1]) == 0 then return end
    open = redis.call('HGET', KEYS[1], 'open') == '1'
  end
  local pending = redis.call('ZCARD', KEYS[3]) > 0
  local function counted(deadline)
    if wrote then held(wrote.bytes, nil, wrote.old) else recount(deadline) end
  end
  if not open and not pending then
    if not keep then redis.call('HDEL', KEYS[1], 'state', 'state_gen') end
    redis.call('DEL', KEYS[3], KEYS[4])
    redis.call('PEXPIRE', KEYS[1], idle_ms)
    redis.call('ZREM', KEYS[5], member)
    redis.call('ZREM', KEYS[6], KEYS[1])
    counted(now + idle_ms)
    return
  end
  if not wrote then redis.call('HSET', KEYS[1], 'used', now) end
  if pending then
    hold(now, idle_ms, lease_ms, member)
    return
  end
  -- KEYS[3] is empty, so gone, and KEYS[4] with it (it holds only tokens of KEYS[3]): no
  -- expiry to set
  redis.call('PEXPIRE', KEYS[1], idle_ms)
  redis.call('ZADD', KEYS[5], now + idle_ms, member)
  if not wrote then  -- past every member's deadline
    redis.call('PEXPIRE', KEYS[5], idle_ms + lease_ms)
  end
  redis.call('ZADD', KEYS[6], now + idle_ms, KEYS[1])
  counted(now + idle_ms)
end

-- the claims of the other steps waiting in the caller's process, from ARGV[first] on (XX:
-- KEYS[4] holds only tokens of KEYS[3])
local function refresh(first, now, lease_ms)
  for i = first, #ARGV do redis.call('ZADD', KEYS[4], 'XX', now + lease_ms, ARGV[i]) end
end
"""

# ARGV: token, start, end, lease ms, idle ms, the model's slots, the id's member, most waiting,
# model version, the request's fingerprint ('' none), whether it carries a request id, the
# cluster's most live sequences, its most state bytes, the bytes a new sequence starts with.
# {'closed'} | {'full', held, ms to the soonest deadline} | {'all', held, ms} |
# {'bytes', total, ms} | {'busy'} | {'fenced'} |
# {'replay', the state the replayed step read ('' the initial one)} |
# {'wait', gen, restarted} | {'go', gen, restarted, step, state_gen, state, alone}; alone '1':
# the step took the lease at once, with no place in the order (FINISH's ARGV[11])
ARRIVE = (
    _COMMON
    + """
local token, start, ending = ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
local lease_ms, idle_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local member, fp = ARGV[7], ARGV[10]
local now = now_ms()
local queued = redis.call('ZCARD', KEYS[3])
-- one read for every branch below; the state too when the turn may come at once
local fields = {'x:' .. token, 'a:' .. token, 'open', 'last_fp', 'last', 'doubt', 'state_gen',
                'gen', 'closer', 'tickets'}
if queued == 0 then
  fields[11], fields[12] = 'step', 'state'
end
local f = redis.call('HMGET', KEYS[1], unpack(fields))
if f[1] then return {'fenced'} end
local arrived = f[2]
if arrived then  -- this arrival ran already (a retry): it takes its turn, nothing more
  hold(now, idle_ms, lease_ms, member)
  local alone = redis.call('GET', KEYS[2]) == token and not redis.call('ZSCORE', KEYS[3], token)
  if not alone and acquire(token, now, lease_ms) ~= 'go' then return {'wait', arrived, 0} end
  local found = state()
  return {'go', arrived, 0, found[1], found[2], found[3], alone and '1' or '0'}
end
local open = f[3] == '1'
local last_fp, last, doubt, state_gen, gen = f[4], f[5], f[6], f[7], f[8]
if fp ~= '' and last_fp == fp and (
    (ending and not open) or (start and state_gen == gen) or
    (not start and (ARGV[11] == '1' or (doubt and doubt == last)))) then
  return {'replay', redis.call('HGET', KEYS[1], 'prev') or ''}
end
-- an END resent after its arrival ran (its replica never learnt it) takes its turn again
local resent = not start and not open and fp ~= '' and ending and f[9] == fp
if not start and not open and not resent then return {'closed'} end
if start then redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now) end
if start and not redis.call('ZSCORE', KEYS[5], member) then
  local held = redis.call('ZCARD', KEYS[5])
  if held >= tonumber(ARGV[6]) then
    local soonest = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
    return {'full', held, tonumber(soonest[2]) - now}
  end
  sweep(now)
  if not redis.call('ZSCORE', KEYS[6], KEYS[1]) then
    local live = redis.call('ZCARD', KEYS[6])
    if live >= tonumber(ARGV[12]) then return {'all', live, soonest(KEYS[6], now)} end
    local total = tonumber(redis.call('HGET', KEYS[8], '#') or '0')
    if total + tonumber(ARGV[14]) > tonumber(ARGV[13]) then
      return {'bytes', total, soonest(KEYS[7], now)}
    end
  end
end
if queued > tonumber(ARGV[8]) then return {'busy'} end
if queued == tonumber(ARGV[8]) and queued > 0 then  -- the step that runs alone counts too
  local holder = redis.call('GET', KEYS[2])
  if holder and not redis.call('ZSCORE', KEYS[3], holder) then return {'busy'} end
end
local restarted = 0
gen = gen or '0'
if start then
  if open then restarted = 1 end
  gen = tostring(redis.call('HINCRBY', KEYS[1], 'gen', 1))
  if f[9] then redis.call('HDEL', KEYS[1], 'closer') end
end
local ticket = tonumber(f[10] or '0') + 1
local set = {'open', ((open or start) and not ending) and '1' or '0', 'version', ARGV[9],
             'used', now, 'a:' .. token, gen, 'tickets', ticket}
if ending and (open or start) then set[11], set[12] = 'closer', fp end
redis.call('HSET', KEYS[1], unpack(set))
-- no other step pending and no lease held: the turn is this step's at once, and it needs no
-- place in the order (the next step queues behind the lease); ARRIVE changes none of the
-- state it read
if queued == 0 and redis.call('SET', KEYS[2], token, 'NX', 'PX', lease_ms) then
  hold(now, idle_ms, lease_ms, member, true)
  return {'go', gen, restarted, f[11], state_gen, f[12], '1'}
end
redis.call('ZADD', KEYS[3], ticket, token)
redis.call('ZADD', KEYS[4], now + lease_ms, token)
hold(now, idle_ms, lease_ms, member)
if acquire(token, now, lease_ms) ~= 'go' then return {'wait', gen, restarted} end
local found = state()
return {'go', gen, restarted, found[1], found[2], found[3], '0'}
"""
)

# ARGV: token, lease ms, idle ms, the id's member, then the tokens waiting behind in this
# process. {'wait'} | {'lost'} | {'go', step, state_gen, state}
TRY = (
    _COMMON
    + """
local token, lease_ms, idle_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if not redis.call('ZSCORE', KEYS[3], token) then return {'lost'} end
local now = now_ms()
redis.call('ZADD', KEYS[4], now + lease_ms, token)
refresh(5, now, lease_ms)
hold(now, idle_ms, lease_ms, ARGV[4])
local got = acquire(token, now, lease_ms)
if got ~= 'go' then return {got} end
local found = state()
return {'go', found[1], found[2], found[3]}
"""
)

# ARGV: token, lease ms, idle ms, the id's member. 1 when the lease is still the token's.
RENEW = (
    _COMMON
    + """
local token, lease_ms, idle_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('GET', KEYS[2]) ~= token then return 0 end
local now = now_ms()
redis.call('PEXPIRE', KEYS[2], lease_ms)
redis.call('ZADD', KEYS[4], 'XX', now + lease_ms, token)  -- none for a step that runs alone
hold(now, idle_ms, lease_ms, ARGV[4])
return 1
"""
)

# ARGV: token, the step read, commit (1) or not, the step's START generation, idle ms, the id's
# member, lease ms, the state, the request's fingerprint, the cluster's most state bytes,
# whether the step ran alone (ARRIVE's `alone`: no place in the order to give up).
# 'kept' (written, now or by an earlier run of this script for the token) | 'stale' (not: the
# lease ran out, or another step was committed since) | 'released' (nothing to write) |
# 'full:<total>:<ms to the soonest expiry>' (not: the cluster's state bytes would pass their
# bound). The lease and the ticket go either
# way; an ended sequence with no step pending keeps what a replay needs, its idle time.
FINISH = (
    _COMMON
    + """
local token, idle_ms, member = ARGV[1], tonumber(ARGV[5]), ARGV[6]
local now = now_ms()
local mine = redis.call('GET', KEYS[2]) == token
local commit = ARGV[3] == '1'
local h
if commit then
  h = redis.call('HMGET', KEYS[1], 'last', 'step', 'open', 'doubt', 'state_gen', 'state')
else
  h = redis.call('HMGET', KEYS[1], 'last')
end
local result, wrote = 'released', nil
if h[1] == token then
  result = 'kept'  -- written by this script's earlier run, whose answer was lost
elseif commit then
  local step = tonumber(h[2] or '0')
  if mine and step == tonumber(ARGV[2]) and (h[3] or redis.call('EXISTS', KEYS[1]) == 1) then
    local prev = (h[5] == ARGV[4] and h[6]) or ''
    local open = h[3] == '1'
    local after = #ARGV[8] + #prev
    if not open then after = #prev end  -- ended: state goes
    local function grown()
      local counts = redis.call('HMGET', KEYS[8], '#', KEYS[1])
      local total, old = tonumber(counts[1] or '0'), tonumber(counts[2] or '0')
      return after - old, total, old
    end
    local more, total, old = grown()
    if more > 0 and total + more > tonumber(ARGV[10]) then
      sweep(now)  -- hashes that expired may still be counted: only a refusal needs them gone
      more, total, old = grown()
    end
    if more > 0 and total + more > tonumber(ARGV[10]) then
      result = 'full:' .. total .. ':' .. soonest(KEYS[7], now)
    else
      redis.call('HSET', KEYS[1], 'state', ARGV[8], 'state_gen', ARGV[4], 'step', step + 1,
                 'last', token, 'last_fp', ARGV[9], 'prev', prev, 'used', now)
      if h[4] then redis.call('HDEL', KEYS[1], 'doubt') end
      result = 'kept'
      wrote = {open = open, bytes = after, old = old}
    end
  else
    result = 'stale'
  end
end
if mine then redis.call('DEL', KEYS[2]) end
unqueue(token, ARGV[11] == '1')
rest(now, idle_ms, tonumber(ARGV[7]), member, false, wrote)
return result
"""
)

# ARGV: token, idle ms, the id's member, lease ms. After a step whose replica never learnt what
# its last call did: 'applied' (its FINISH committed: a resend of it is a replay) or 'fenced'
# (it never will: its lease and ticket go, and no script acts on its token again).
SETTLE = (
    _COMMON
    + """
local token, idle_ms, member = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('HGET', KEYS[1], 'last') == token then
  redis.call('HSET', KEYS[1], 'doubt', token)
  return 'applied'
end
local existed = redis.call('EXISTS', KEYS[1]) == 1
redis.call('HSET', KEYS[1], 'x:' .. token, '1')
if not existed then
  redis.call('PEXPIRE', KEYS[1], idle_ms)
  return 'fenced'
end
if redis.call('GET', KEYS[2]) == token then redis.call('DEL', KEYS[2]) end
unqueue(token)
rest(now_ms(), idle_ms, tonumber(ARGV[4]), member, true)
return 'fenced'
"""
)

# KEYS: seqall, seqheld, seqbytes; ARGV: the key prefix (opserve:<cluster>:), then sequence
# hashes (KEYS[1] of the other scripts) of a model that was unloaded. Each sequence's keys go,
# and its place in the cluster's counts. The number of hashes dropped.
FORGET = """
local prefix = ARGV[1]
local dropped = 0
for i = 2, #ARGV do
  local key = ARGV[i]
  local rest = string.sub(key, #prefix + 5)  -- after 'seq:': <model>:<version>:<member>
  if string.sub(key, 1, #prefix + 4) == prefix .. 'seq:' then
    local model, version = string.match(rest, '^([^:]*):([^:]*):')
    redis.call('UNLINK', key, prefix .. 'seqlease:' .. rest, prefix .. 'seqqueue:' .. rest,
               prefix .. 'seqclaim:' .. rest)
    if model then redis.call('UNLINK', prefix .. 'seqlive:' .. model .. ':' .. version) end
    local bytes = tonumber(redis.call('HGET', KEYS[3], key) or '0')
    if bytes ~= 0 then redis.call('HINCRBY', KEYS[3], '#', -bytes) end
    redis.call('HDEL', KEYS[3], key)
    redis.call('ZREM', KEYS[1], key)
    redis.call('ZREM', KEYS[2], key)
    dropped = dropped + 1
  end
end
return dropped
"""
