// Package dispatch takes slow, side-effecting calls — API writes — off a hot
// serial loop, such as a scheduler's scheduling cycle, and runs them
// asynchronously: by priority with aging, coalesced per key, bounded with
// backpressure, retried with judgement, cancellable, fair across tenants,
// observable, and switchable back to the synchronous path at run time. It is
// the generic form of kube-scheduler's APIDispatcher (KEP-5229).
//
// # One key per object
//
// A key names one object, and every write to that object uses it: a pod's
// bind and its status patch both go under the pod's UID. Per key at most one
// call runs and one is pending, so writes to one object never race (a stale
// status patch cannot overtake the bind, kubernetes#139602), and a write
// submitted while another is pending is merged into it (Config.Merge).
//
//	d, err := dispatch.New(exec, dispatch.Config[types.UID, Op]{Workers: 8, Merge: merge})
//	if err != nil { ... } // an invalid field is reported here
//	defer d.Close(ctx)
//	// In the hot loop both return at once, in the pod's one lane.
//	d.Post(pod.UID, statusPatch, dispatch.SubmitOptions{Priority: 0})
//	t, err := d.Submit(ctx, pod.UID, bind, dispatch.SubmitOptions{Priority: 10})
//	res, err := t.Wait(ctx) // or select on t.Done()
//
// # Where things are
//
// Dispatcher runs the calls; a Ticket is one submission's handle; Result
// and Outcome say how it ended, in exactly one State, told once, outside
// every lock. Config sets it up, each zero field meaning its default; its
// policies (StartPolicy: reserved workers, adaptive concurrency, the
// deadline check; RolloutPolicy: the mode and the fallback) group the
// tuning. Each rule is stated where it applies:
// ordering at Config.AgingBand and TenantConfig.Weight, coalescing at
// Config.Merge, waiters and deadlines at Dispatcher.Submit and
// SubmitOptions, the execution context at ExecFunc, errors at the sentinels
// (ErrBackpressure, ...), events at Observer.
//
// # Callbacks
//
// exec, Config's callbacks, the Observer and Amend's function are user
// code. Whatever one does — panic, exit its goroutine, block, call back
// into the Dispatcher — no outcome is lost, no key is wedged, and Close
// returns once no callback blocks a goroutine it waits for; the few that
// run under the dispatcher's lock (below) must neither block nor call it. A
// panic (or runtime.Goexit) in exec, NoOp, BeforeRetry or Classify ends the
// call Failed with a *PanicError, never retried: exec may have done half
// its work. In Merge, Follow or Moot it refuses the incoming submission; in
// Amend's function Amend returns it; in OnDone, an Observer method or Label
// it is counted (Stats.CallbackPanics) — an Observer.OnStart that exits
// sends its call back to the queue untouched, three times in a row at most
// before one attempt, which then begins without it; in the RateLimiter it
// is counted too, and no token is granted by it (see RateLimiter). A
// blocked callback that runs outside the lock holds up only its own
// goroutine: the clock that drives deadlines and backoffs runs no user
// code. On a worker, that includes the call it has taken next: a worker
// tells the completion hooks and observer events of the call it ended after
// taking its next call, in one trip through the lock, so one that blocks
// there holds that call up too (no other worker starts it meanwhile); hand
// slow work to a goroutine of your own. Close, though, waits for a callback
// that blocks a goroutine Close waits for (a worker, the notifier, a
// Sync-mode caller running its call or telling of it), past the end of
// Close's context, as for an exec that ignores its context. Merge,
// Follow, Moot, Amend's function and the RateLimiter's Allow, TryAccept,
// QPS and ReserveN run under the dispatcher's lock: while one runs,
// nothing else in the dispatcher moves, and one that calls the Dispatcher
// waits for itself for ever. They must be fast and must not call it; any
// other callback may, and a call that would wait for its own goroutine
// returns ErrReentrant.
//
// A Dispatcher is safe for concurrent use. What the current implementation
// costs per call is described in BENCHMARKS.md; a queued call holds
// 190–230 bytes of memory with int keys and values, 210–250 with a
// deadline of its own, from 10³ to 10⁶ queued (BenchmarkScale's B/queued,
// 64-bit). What a burst of keys leaves behind once it has drained does not
// grow with the burst: no key or value of an ended call stays reachable,
// and a second after the keys have left, the key table has shrunk and
// what stays is at most 256 lanes kept for reuse, with the memory that
// holds them (TestBurstDrainedFreesMemory).
package dispatch
