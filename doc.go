// Package dispatch takes slow, side-effecting calls — API writes — off a hot
// serial loop, such as a scheduler's scheduling cycle, and runs them
// asynchronously: by priority with aging, coalesced per key, bounded with
// backpressure, retried with judgement, cancellable, fair across tenants,
// observable, and switchable back to the synchronous path at run time. It is
// the generic form of kube-scheduler's APIDispatcher (KEP-5229).
//
// # The pattern
//
// A key names one object, and every write to that object uses it: a pod's
// bind and its status patch both go under the pod's UID. Per key at most one
// call runs and one is pending, so writes to one object never race (a stale
// status patch cannot overtake the bind, kubernetes#139602), and a write
// submitted while another is pending is merged into it by Config.Merge.
//
//	d, err := dispatch.New(exec, dispatch.Config[types.UID, Op]{Workers: 8, Merge: merge})
//	if err != nil { ... } // an invalid field is reported here
//	defer d.Close(ctx)
//
//	// In the hot loop, both return at once, and share the pod's lane.
//	d.Post(pod.UID, statusPatch, dispatch.SubmitOptions{Priority: 0})
//	t, err := d.Submit(ctx, pod.UID, bind, dispatch.SubmitOptions{Priority: 10})
//	res, err := t.Wait(ctx) // or select on t.Done()
//
// # The types
//
//   - Dispatcher runs the calls: Submit returns a Ticket on the outcome,
//     Post is fire-and-forget, Amend rewrites a pending call, Cancel ends a
//     key's calls, SetMode switches between ModeAsync and ModeSync, Stats
//     is a snapshot, Close drains and stops.
//   - Config sets it up; every zero field means its default, stated in the
//     field's doc. RetryPolicy, BreakerPolicy, TenantConfig, StartPolicy
//     (reserved workers, AdaptivePolicy, the deadline check) and
//     RolloutPolicy (mode, FallbackPolicy) group the rest.
//   - SubmitOptions are one submission's priority, deadline, tenant,
//     generation (stale-work fencing) and idempotency key.
//   - Result and Outcome say how a submission or call ended: exactly one
//     State each, told once, outside every lock. Errors match the sentinels
//     (ErrBackpressure, ErrStale, ...) with errors.Is.
//   - Observer receives every event, for metrics.
//
// # Where the rules are
//
// Ordering (priority bands, aging, tenant weights): Config.AgingBand and
// TenantConfig.Weight. Coalescing: Config.Merge, SkipIncoming,
// ReplacePending. Waiters, deadlines and cancellation: Dispatcher.Submit,
// Ticket, SubmitOptions.Generation. Bounds: Config.Capacity,
// Config.MaxWaiters, BackpressureError. Retries: Config.Classify, Class,
// Config.BeforeRetry, RetryPolicy. The execution context: ExecFunc.
//
// # Callbacks
//
// exec, Config's callbacks, the Observer and Amend's function are user
// code. Whatever one does — panic, exit its goroutine, block, call back
// into the Dispatcher — no outcome is lost, no key is wedged, and Close
// returns. A panic in exec, NoOp, BeforeRetry or Classify ends the call
// Failed with a *PanicError, never retried; in Merge it refuses the
// incoming submission; in Amend's function Amend returns it; in OnDone, an
// Observer method or Label it is counted (Stats.CallbackPanics). A
// blocked callback holds up only its own goroutine: the clock that drives
// deadlines and backoffs runs no user code. Merge and Amend's function run
// under the dispatcher's lock and must not call it; any other callback may,
// and a call that would wait for its own goroutine returns ErrReentrant.
//
// A Dispatcher is safe for concurrent use. What the current implementation
// costs per call is described, with the tests that pin it, in BENCHMARKS.md.
package dispatch
