// Package dispatch takes slow, side-effecting calls — API writes, external
// resource creation — off a hot serial loop, such as a scheduler's
// scheduling cycle or a controller's reconcile loop, and runs them
// asynchronously. It is the generic form of kube-scheduler's APIDispatcher
// (KEP-5229), with the priority, bounds, deadlines and fencing that one lacks.
//
// # Mental model
//
// Calls are submitted under a key K (an object UID, say). Per key there is
// at most one call running and at most one pending:
//
//   - Coalesce by key. A submission for a key whose call is pending is merged
//     into it by Config.Merge: combined, kept, overwritten, skipped as moot
//     (SkipIncoming), or refused. Every submission merged into a call shares
//     its one outcome. A submission for a key whose call is running becomes
//     the pending successor; it runs after the running call, keeping its
//     place in line.
//   - Run by priority. Ready calls run highest priority band first; within a
//     band a waiting call gains one level per aging interval, so a
//     low-priority call cannot starve behind its own band, and no call ever
//     passes one of a higher band. A merged call runs at the highest
//     priority and earliest enqueue time of its live waiters, in the tenant
//     and under the label of the most urgent.
//   - Bound everything. Tracked keys and live tickets are capped
//     (Config.Capacity, Config.MaxWaiters); beyond the cap a submission is
//     refused at once with ErrBackpressure instead of growing memory. A
//     fixed pool of workers (Config.Workers), optionally adaptive
//     (Config.Adaptive), and a rate limiter (Config.RateLimit) bound the API
//     load; a worker takes its token before it chooses the call, and some
//     workers can be kept for urgent calls (Config.Reserve), so priority
//     holds where the token and the worker are handed out.
//   - Deliver outcomes exactly once. Every accepted submission ends in one
//     State — Succeeded, Skipped, Failed, Canceled, Expired, Dropped, Stale
//     or Closed — told once, outside every lock, after the dispatcher's own
//     bookkeeping is final. A completion hook (Config.OnDone) fires once per
//     finished call.
//
// # Priority, aging and fairness: the exact rule
//
// Priorities fall into bands of Config.AgingBand consecutive levels (10 by
// default): band = floor(priority / AgingBand). Aging works only within a
// band. A worker picks the next call in two steps. Each tenant
// (SubmitOptions.Tenant) keeps its ready calls ordered by band (highest
// first), then by virtual time within the band, enqueue − offset × aging
// (offset = priority − band × AgingBand), then arrival. Across tenants,
// the worker compares each tenant's best call by its band, then by its
// level within the band at that moment — its offset plus one per aging
// interval it has waited, floor((now − enqueue) / aging) — and takes the
// highest. Among tenants whose best calls are at the same level, it takes
// the tenant with the lowest stride pass; each pick advances a tenant's
// pass by 2³²/weight, so tenants with backlogs at one level share the
// workers in proportion to their weights. A tenant at its in-flight cap
// (TenantConfig.MaxInFlight) is passed over; a call below the
// reservation's priority (Config.Reserve, judged on priority, never on
// age) waits if the unreserved workers are busy.
//
// So a call never runs before a ready call of a higher band, however long
// it has waited: a binding at priority 10 never waits behind status
// patches at 0, however old they are, and the patches run whenever no
// binding is ready. Within a band aging bounds starvation: a call of
// priority p runs before any call of its band with priority q > p that
// arrives more than (q−p) × aging after it; behind a stream of such work
// that keeps the workers busy without an ever-growing backlog, it starts
// within about (q−p+1) × aging. Across bands, a lower band waits for the
// higher ones: that is what a band is for. AgingBand 1 is strict priority.
//
// Each submission is a waiter with its own deadline and context. When the
// last waiter of a call leaves, a pending call is removed and a running
// call's context is cancelled. Generations (SubmitOptions.Generation) fence
// stale work: a newer generation supersedes older ones for its key, and an
// execution that returns after its call was cancelled, superseded or expired
// is reported Stale — kept for audit, never delivered as success. A call
// whose deadline is closer than its label's usual execution time is not
// started at all (Config.StartCheck).
//
// # Example
//
//	d, err := dispatch.New(func(ctx context.Context, uid types.UID, p Patch) error {
//		return client.Patch(ctx, uid, p)
//	}, dispatch.Config[types.UID, Patch]{Workers: 8, Merge: mergePatches})
//	if err != nil { ... }
//	defer d.Close(ctx)
//
//	// In the hot loop: returns at once.
//	d.Post(uid, statusPatch, dispatch.SubmitOptions{Priority: 0})
//	t, err := d.Submit(ctx, uid, bind, dispatch.SubmitOptions{Priority: 10})
//	...
//	res, err := t.Wait(ctx) // or select on t.Done()
//
// # Failure, overload and rollback
//
// A classifier (Config.Classify) judges each failed execution Retry,
// Permanent or Recompute; retries wait out an exponential backoff (or the
// server's Retry-After) in the queue, never in a worker, bounded by
// attempts, the call's deadline, a retry budget and the tenant's quota, and
// a circuit breaker (Config.Breaker) stops executions after sustained
// failures. When full, a new key evicts the worst droppable queued call if
// it is better, or is refused with ErrBackpressure; tenants get quotas and
// in-flight caps (Config.Tenants). Sync mode (Config.Mode, SetMode) runs
// each submission inline in its caller through the same machinery — the
// feature gate's off position — and a fallback policy (Config.Fallback)
// switches to it by itself when backlog, queue wait, failures or the breaker
// cross a threshold. Stats gives a consistent snapshot; an Observer
// (Config.Observer) receives every event outside the lock, for metrics.
//
// # Callbacks: what user code may do
//
// The dispatcher calls user code: exec, and Config's Merge, NoOp, Label,
// OnDone, Classify, BeforeRetry and Observer, and Amend's function. One rule
// covers all of it: whatever a callback does, no outcome is lost, no key is
// wedged, the process is not killed, and Close returns.
//
//   - Panic. Contained. In exec, NoOp, BeforeRetry or Classify, the call
//     ends Failed with a *PanicError naming the callback, and is never
//     retried: exec may have done half its side effect. In Merge, the
//     incoming submission is refused (ErrMergeRejected wrapping the
//     *PanicError); in Amend's function, Amend returns it. In OnDone, an
//     Observer method or Label, which have nowhere to report to, the panic
//     is counted (Stats.CallbackPanics, LastCallbackPanic) and the call goes
//     on, unlabelled for Label.
//   - Exit its goroutine (runtime.Goexit, as t.FailNow does). Only that
//     goroutine ends. What the callback interrupted is finished on the way
//     out — an attempt it was part of ends Failed with a *PanicError of
//     Value ErrGoexit, a call its worker had taken but not yet started goes
//     back to the queue untouched, the lock is released, what was to be
//     told is told — and a worker that exits is replaced. In OnDone, an
//     Observer method or Label the exit is counted like a panic.
//   - Block. It holds up only the goroutine running it: a worker (one
//     execution fewer), a submitter, a caller of Cancel or Close. The clock
//     that drives deadlines and backoffs runs no user code, so a blocked
//     hook or observer never makes a deadline late. Close waits for running
//     executions; an exec that ignores its context holds Close up.
//   - Call back into the Dispatcher. Any method may be called from any
//     callback, except from Merge and Amend's function, which run under the
//     dispatcher's lock and must not call it (they would deadlock). A call
//     that would have to wait for the very goroutine making it returns
//     ErrReentrant instead of hanging: Close and SetMode's drain (which take
//     effect, and return at once), and a Sync-mode submission for the key
//     whose call this goroutine is executing, or for any key from the
//     circuit breaker's half-open probe (refused).
//
// # Cost and concurrency
//
// A Dispatcher is safe for concurrent use. Submit and Post hash the key
// before they take the one lock, read the clock at most once (Submit
// before the lock; Post before it too when the Posts just before it
// needed the clock, as Posts of new keys do, and not at all when it
// coalesces into a pending key's fire-and-forget submissions), and do a
// table lookup and an append to their priority's FIFO run — or, for a call
// out of order, at most one B-tree insert or re-key: O(log n) in the number
// of queued calls. They start no goroutine and create no timer or context.
// Post allocates nothing when it coalesces, and nothing for a new key
// either once released keys have left lanes to reuse; Submit allocates its
// Ticket (a Done channel only if one is asked for): 80 bytes on a 64-bit
// platform whatever K and T are, 144 with a deadline or a context to
// watch. The outcome a ticket reports is not held in it (see Ticket).
//
// A call's end does not visit every ticket it served: tickets without a
// deadline or a context to watch share one recorded outcome from a call's
// fourth on (see Ticket). A hot key's call that gathered ten
// thousand such waiters ends with one result built and its list of
// pointers cleared, not with a walk through ten thousand tickets' memory
// under the lock. Tickets with a deadline or a context are still visited
// there, and so are a call's first three; every ticket it tells on time
// shares one Result, which is that call end's one allocation. The Done
// channels that riders made are closed after the lock is released.
//
// A worker takes the lock once per call: the end of one attempt and the
// start of the next share it. It reads the clock twice per call, around
// exec, and allocates nothing in the steady state beyond the Result of a
// call with tickets (above): the execution context
// is the dispatcher's own and is reused (see ExecFunc), and a key's release
// costs one table deletion without hashing. One timer goroutine serves
// every deadline, backoff and rate-limit token. Workers start on first use,
// and Close waits for all of them.
package dispatch
