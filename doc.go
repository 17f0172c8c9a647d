// Package dispatch takes slow, side-effecting calls — API writes, external
// resource creation — off a hot serial loop, such as a scheduler's
// scheduling cycle or a controller's reconcile loop, and runs them
// asynchronously. It is the generic form of kube-scheduler's APIDispatcher
// (KEP-5229), with the priority, bounds, deadlines and fencing that one lacks.
//
// # Mental model
//
// Calls are submitted under a key K (an object UID, say). Per key there is
// at most one call in flight and at most one pending call:
//
//   - Coalesce by key. A submission for a key whose call is pending is merged
//     into it by the merge function (Config.Merge): combined, kept, overwritten,
//     or refused. Every submission merged into a call shares its one outcome.
//     A submission for a key whose call is in flight becomes the pending
//     successor; it runs after the in-flight call, keeping its place in line.
//   - Run by priority. Ready calls wait in a B-tree ordered by effective
//     priority with aging, then arrival: virtual time = enqueue time −
//     priority × aging, so a call gains one priority level per aging interval
//     and a low-priority call cannot starve. A merged call runs at the
//     highest priority and earliest enqueue time of its live waiters.
//   - Bound everything. Tracked keys and live tickets are capped
//     (Config.Capacity, Config.MaxWaiters); beyond the cap a submission is
//     refused at once with ErrBackpressure instead of growing memory. A fixed
//     pool of workers (Config.Workers) and an optional rate limiter bound the
//     API load.
//   - Deliver outcomes exactly once. Every accepted submission ends in one
//     State — Succeeded, Skipped, Failed, Canceled, Expired, Dropped, Stale
//     or Closed — told once, outside every lock, after the dispatcher's own
//     bookkeeping is final. A completion hook (Config.OnDone) fires once per
//     finished call.
//
// # Priority, aging and fairness: the exact rule
//
// A worker picks the next call in two steps. Each tenant (SubmitOptions.Tenant)
// keeps its ready calls ordered by virtual time enqueue − priority × aging,
// then arrival; without aging, by priority, then arrival. Across tenants, the
// worker compares each tenant's best call by its effective level at that
// moment — its priority plus one per aging interval it has waited,
// floor((now − virtual time) / aging) — and takes the highest. Among tenants
// whose best calls are at the same level, it takes the tenant with the lowest
// stride pass; each pick advances a tenant's pass by 2³²/weight, so tenants
// with backlogs at one level share the workers in proportion to their
// weights. A tenant at its in-flight cap (TenantConfig.MaxInFlight) is passed
// over.
//
// Aging bounds starvation: a call of priority p runs before any call of
// priority q > p that arrives more than (q−p) × aging after it. Behind a
// stream of priority-q work that keeps the workers busy without an
// ever-growing backlog, it therefore starts within about (q−p+1) × aging.
// Work enqueued before it at a higher priority still goes first: aging lifts
// every waiting call alike. Config.StrictPriority turns aging off, which can
// starve.
//
// Each submission is a waiter with its own deadline and context. When the
// last waiter of a call leaves, a pending call is removed and an in-flight
// call's context is cancelled. Generations (SubmitOptions.Generation) fence
// stale work: a newer generation supersedes older ones for its key, and an
// execution that returns after its call was cancelled, superseded or expired
// is reported Stale — kept for audit, never delivered as success.
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
// Permanent or Recompute; retries wait out an exponential backoff in the
// queue, never in a worker, bounded by attempts, the call's deadline and a
// retry budget, and a circuit breaker (Config.Breaker) stops executions after
// sustained failures. When full, a new key evicts the worst droppable queued
// call if it is better, or is refused with ErrBackpressure; tenants get
// quotas and in-flight caps (Config.Tenants). Sync mode (Config.Mode, SetMode) runs
// each submission inline in its caller through the same machinery — the
// feature gate's off position — and a fallback policy (Config.Fallback) switches
// to it by itself when backlog, queue wait, failures or the breaker cross a
// threshold. Stats gives a consistent snapshot; an Observer (Config.Observer)
// receives every event outside the lock, for metrics.
//
// # Cost and concurrency
//
// A Dispatcher is safe for concurrent use. Submit and Post take one lock,
// read the clock once, and do a map lookup and at most one B-tree insert or
// re-key: O(log n) in the number of queued calls. They start no goroutine and
// create no timer or context. Post allocates nothing when it coalesces, and
// nothing for a new key either once released keys have left slots to reuse;
// Submit allocates its Ticket (a Done channel only if one is asked for). One
// timer goroutine serves every deadline and backoff. Workers start on first
// use, and Close waits for all of them.
package dispatch
