package dispatch_test

import (
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

var (
	errFuzzPerm      = errors.New("fuzz: permanent failure")
	errFuzzRetry     = errors.New("fuzz: retryable failure")
	errFuzzRecompute = errors.New("fuzz: conflict, recompute")
	errFuzzBefore    = errors.New("fuzz: before-retry hook failed")
	errFuzzMerge     = errors.New("fuzz: merge refused")
	errFuzzFollow    = errors.New("fuzz: follow refused")
)

const (
	fzKeys       = 4
	fzMaxOps     = 64
	fzBackoff    = time.Millisecond
	fzMaxBackoff = 4 * time.Millisecond
	fzCooldown   = 3 * time.Millisecond
)

// FuzzQueueModel runs a decoded sequence of operations against the real
// Dispatcher and against fzModel, a reference written with plain slices and
// maps, and compares them after every step.
//
// It uses the public API only. Its parts:
//
//   - fuzz_test.go: this entry point, the shared constants and the
//     hand-written seeds;
//   - fuzz_codec_test.go: how bytes decode into a configuration and a
//     sequence of operations, and fzEncode, its inverse, which writes the
//     seeds;
//   - fuzz_model_test.go: the reference model;
//   - fuzz_harness_test.go: the harness that drives the Dispatcher and the
//     model in step and compares them.
//
// The Dispatcher runs with one worker inside a testing/synctest bubble, and
// exec blocks until the test releases it, so every step is deterministic:
// after synctest.Wait the worker is either idle or blocked in exec, the
// clock goroutine is asleep, and virtual time only moves when an "advance"
// step sleeps. What is compared after each step:
//
//   - which calls the worker started, in order: key, value as executed and
//     the execution context's deadline;
//   - every ticket: whether its outcome is known, and then its State, Call,
//     Waiters, Attempts and error class (and the cancel cause, if any); an
//     outcome, once known, must never change;
//   - the completion hook's results since the last step, as a multiset;
//   - Stats (every gauge and counter, refusals and sheds by bound, and
//     per tenant Queued, InFlight, Admitted, Rejected and Dropped), the
//     conservation law, and that no tenant is over its MaxQueued;
//   - Busy for every key, what Cancel(key) reports, what Submit and Post
//     return (the sentinel, and the Bound of a backpressure refusal, the
//     merge's or Follow's error, Follow's *PanicError), and when and with
//     what Close returns.
//
// The model covers: per-key one in-flight and one pending call, successors,
// coalescing (replace, sum, or a sum that refuses some values or finds them
// moot via Config.Merge: a submission the merge skips with SkipIncoming
// ends Skipped at once, alone, and leaves the pending call as it was),
// idempotency-key conflicts, priority with aging as virtual time (enqueue −
// priority×aging, computed exactly with math/big, so that higher priority
// runs first for every pair of int priorities at every aging) then FIFO,
// strict priority when aging is 0, re-derivation of a call's priority and
// enqueue time when a waiter leaves, labels (Config.Label; a submission
// that raises a pending call's priority brings its label; Stats.Labels),
// generations (stale rejection, supersession), Config.Follow (fzFollow: a
// submission made while its key's lane has a running call — in flight,
// orphaned or not, or a retry back in the queue that could not absorb its
// successor — and that does not supersede is skipped, refused, refused by
// a panic, or rewritten from the running call, differently when a call is
// also pending, into which the rewrite is then merged), deadlines
// from SubmitOptions and from the Submit context (the fire-and-forget
// aggregate with its shared latest deadline), the execution context's
// deadline, Ticket.Cancel, context cancellation with a cause, Cancel(key,
// cause), capacity and waiter bounds, shedding of droppable pending calls,
// the no-op test, the completion hook, retries (Retry, Permanent, Recompute,
// panics; exponential backoff without jitter in the delay index; attempt
// limit; the deadline bound; a successor absorbed into a retry, or skipped
// when the merge finds it moot), the
// before-retry hook (rebuild, already done, failure), the circuit breaker
// (consecutive retryable failures trip it, a cool-down, one half-open probe,
// refusal of droppable new keys while open), stale executions (exec that
// honours or ignores its context), Close that drains and Close whose context
// ends.
//
// With tenants on (fzConfig.tenants) submissions name one of three
// configured tenants, each with a MaxQueued of 0 to 3 and a weight of 1 to
// 4, and the model covers: the tenant's quota for a new call (of a new
// key, a successor, or a supersede, which frees the superseded call of its
// own tenant) and for a retry (the tenant's worst droppable call queued or
// backing off, alone in its lane, is evicted if the newcomer would run
// before it, else the submission is refused, or the retry gives up);
// adoption — a submission that outranks a pending call of another tenant,
// or replaces it (ReplacePending), moves the call into its own tenant,
// which must have room for it: a victim is evicted or the submission
// refused before the merge when it outranks, after it when it replaces,
// and the call is then left as it was; a retry that absorbs a more urgent
// successor, or is replaced by one, moves likewise — and the pick across
// tenants exactly (queue.pick): the tenant whose best ready call has the
// highest level now (its band, then its offset plus one per Aging waited),
// then the lowest stride pass (2³²/Weight per pick; a tenant that becomes
// active starts at the pass of the tenant picked last if it is behind
// it), then the first in the active list, which a tenant joins at the end
// and leaves by handing its place to the last. The list's order depends on
// the order in which calls enter and leave the ready set within one
// instant, so the model follows the dispatcher there too: expiries in the
// deadline index's order (deadline, then when each entry was indexed; a
// fire-and-forget aggregate whose deadline later posts extended is
// re-indexed when its old deadline comes) and ends of backoff by time,
// then arrival. One restriction keeps that order exact: a Submit context's
// deadline is passed as the submission's own and the context's is set a
// nanosecond later, since the context's timer would fire at the same
// instant as the dispatcher's clock and the two race to end the ticket
// (either is correct, and without tenants nothing shows which won).
// Without tenants every submission is of the tenant of no name, which has
// neither quota nor weight, and Stats.Tenants holds it alone.
//
// Shedding follows Config.Capacity and BreakerPolicy.RefuseDroppable: when
// the key capacity is full, a new key looks at the droppable pending calls
// (queued or backing off, whose key has nothing in flight) and takes the
// one that would run last; if the newcomer would run before it, that call
// is removed, its waiters end Dropped and the hook sees Dropped, and the
// newcomer is admitted; otherwise the newcomer is refused with
// ErrBackpressure. The waiter bound and the breaker's refusal of droppable
// work are checked before anything is evicted: a refused submission
// changes nothing.
//
// Priorities and agings reach the extremes (see fzPrios and fzAgings):
// ±MaxInt, MinInt, Kubernetes' 2 000 000 000 and 2 000 001 000, pairs that
// straddle MaxInt64 / aging, and agings of 5s, 10s, an hour, a day and
// MaxInt64 ns, so that priority × aging overflows int64.
//
// It leaves out, on purpose: more than one worker (ordering would no longer
// be deterministic), jittered backoff and the retry budget (random or
// windowed; the budget is disabled), the breaker's failure-ratio rule (it
// is set to +Inf), the rate limiter, MaxInFlight (with one worker a
// tenant's cap never holds back a pick: tenant_test.go's), tenants that
// Config.Tenants does not name (DefaultTenant's, forgotten with their
// statistics when they have no call left: tenant_test.go's and the chaos
// soak's), the start check (disabled: it judges by a quantile of recent
// execution times; start_test.go has its tests), Sync mode, SetMode and
// the fallback policy (mode_test.go's), Amend and AmendNewest, the
// observer, Goexit in Follow (admit_test.go's: it ends the submitting
// goroutine, the test's), and QueueWait/RunTime values (only checked to be
// non-negative).
//
// The seeds (fzSeeds; fzRuleSeeds, each with the rules TestFuzzSeedRules
// checks it exercises; and the inputs under testdata/fuzz/FuzzQueueModel
// that fuzzing once found) run as ordinary subtests under go test;
// go test -run '^$' -fuzz FuzzQueueModel . looks for new ones.
// DISPATCH_FUZZ_TRACE=1 logs every input's operations, the completion
// hook's results and the rules the model saw exercised. An input that runs for fzHang of real time is a hang:
// the process panics with every goroutine's stack, so that neither go test
// nor the fuzzer waits forever (inside the bubble, a deadlock fails the
// input on its own; this catches a livelock, which virtual time cannot).
func FuzzQueueModel(f *testing.F) {
	for _, s := range fzSeeds {
		f.Add(s)
	}
	for _, s := range fzRuleSeeds {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog := time.AfterFunc(fzHang, func() {
			debug.SetTraceback("all")
			panic(fmt.Sprintf("FuzzQueueModel: input %q still running after %v", data, fzHang))
		})
		defer watchdog.Stop()
		synctest.Test(t, func(t *testing.T) { fzRun(t, data) })
	})
}

// fzHang is how long one input may run, in real time. Inputs take
// milliseconds, even under the race detector.
const fzHang = time.Minute

// fzSeeds are hand-written cases, encoded with fzEncode (the inverse of the
// decoder) so that they read as what they do.
var fzSeeds = [][]byte{
	// Replace merge: posts coalesce into the pending call while another key
	// runs; a ticket joins them.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzPostOp(1, 0), fzPostOp(0, 0), fzPostOp(0, 0), fzSubmitOp(0, 1),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Sum merge, priorities and aging: a low-priority call ages past newer
	// high-priority ones.
	fzEncode(fzConfig{merge: 1, aging: time.Millisecond, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 2), fzAdvanceOp(10*time.Millisecond),
		fzSubmitOp(3, 3), fzSubmitOp(1, 1),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Strict priority with extreme priorities.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, math.MinInt), fzSubmitOp(2, math.MaxInt), fzSubmitOp(3, math.MaxInt-1),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Deadlines: a pending call, an in-flight call and a ctx deadline
	// expire; fire-and-forget posts share the latest deadline.
	fzEncode(fzConfig{honour: true, aging: time.Millisecond, capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzDeadline(time.Millisecond)),
		fzWith(fzSubmitOp(1, 0), fzDeadline(2*time.Millisecond)),
		fzWith(fzSubmitOp(1, 1), fzCtx(fzCtxDeadline, time.Millisecond)),
		fzWith(fzPostOp(2, 0), fzDeadline(3*time.Millisecond)),
		fzWith(fzPostOp(2, 0), fzDeadline(5*time.Millisecond)),
		fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond),
		fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Fire-and-forget posts extend their shared deadline: the clock
	// re-indexes the aggregate instead of expiring it early.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzSubmitOp(1, 0),
		fzWith(fzPostOp(0, 0), fzDeadline(time.Millisecond)),
		fzWith(fzPostOp(0, 0), fzDeadline(3*time.Millisecond)),
		fzWith(fzSubmitOp(0, 0), fzDeadline(2*time.Millisecond)),
		fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond), fzAdvanceOp(time.Millisecond),
		fzFinishOp(fzOK)),
	// Idempotency keys: equal ones coalesce, different ones are refused.
	fzEncode(fzConfig{merge: 1, capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzIdem("x")), fzSubmitOp(0, 0), fzWith(fzPostOp(0, 0), fzIdem("x")),
		fzWith(fzSubmitOp(0, 0), fzIdem("y")), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Generations: a newer one supersedes the in-flight call and its
	// successor; an older one is stale.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzGen(1), fzCtx(fzCtxCancelable, 0)),
		fzWith(fzSubmitOp(0, 0), fzGen(1)),
		fzWith(fzSubmitOp(0, 0), fzGen(2)),
		fzWith(fzSubmitOp(0, 0), fzGen(0)),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Cancellation: a ctx with a cause, Ticket.Cancel, Cancel(key).
	fzEncode(fzConfig{honour: true, capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzCtx(fzCtxCancelable, 0)),
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(1, 0),
		fzOp{kind: fzCtxCancel, idx: 0}, fzOp{kind: fzTicketCancel, idx: 2},
		fzOp{kind: fzCancelKey, key: 0}, fzOp{kind: fzCancelKey, key: 0},
		fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Retries: a retryable failure absorbs the successor, backs off, and
	// runs out of attempts; then permanent, panic, recompute.
	fzEncode(fzConfig{merge: 1, capacity: 4, maxAttempts: 3},
		fzSubmitOp(0, 0), fzSubmitOp(0, 0), fzFinishOp(fzRetry),
		fzAdvanceOp(time.Millisecond), fzFinishOp(fzRetry), fzAdvanceOp(2*time.Millisecond), fzFinishOp(fzRetry),
		fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzSubmitOp(3, 0),
		fzFinishOp(fzPerm), fzFinishOp(fzPanic), fzFinishOp(fzRecompute)),
	// The before-retry hook and the no-op test.
	fzEncode(fzConfig{noop: true, before: true, capacity: 4, maxAttempts: 3},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzSubmitOp(3, 0), fzSubmitOp(0, 0),
		fzFinishOp(fzRetry), fzAdvanceOp(time.Millisecond), fzFinishOp(fzRecompute), fzFinishOp(fzRetry),
		fzAdvanceOp(time.Millisecond), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Capacity and waiter bounds.
	fzEncode(fzConfig{capacity: 2, maxWaiters: 2, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzPostOp(2, 0), fzSubmitOp(1, 0),
		fzPostOp(1, 0), fzFinishOp(fzOK), fzSubmitOp(2, 0), fzFinishOp(fzOK)),
	// Shedding: a droppable pending call makes room for a better newcomer.
	fzEncode(fzConfig{capacity: 2, maxAttempts: 1},
		fzSubmitOp(0, 0), fzWith(fzPostOp(1, 0), fzDrop()), fzSubmitOp(2, 2),
		fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// A droppable newcomer refused by the open breaker must not evict
	// anything on its way out.
	fzEncode(fzConfig{capacity: 2, maxAttempts: 1, breaker: true, brFailures: 1, brRefuse: true},
		fzSubmitOp(0, 0), fzWith(fzSubmitOp(1, 0), fzDrop()), fzFinishOp(fzRetry),
		fzPostOp(2, 0), fzWith(fzPostOp(3, 5), fzDrop()), fzAdvanceOp(3*time.Millisecond),
		fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// The breaker trips, cools down, probes, and closes again.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 2, breaker: true, brFailures: 2},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzFinishOp(fzRetry), fzFinishOp(fzRetry),
		fzSubmitOp(3, 0), fzAdvanceOp(time.Millisecond), fzAdvanceOp(2*time.Millisecond), fzFinishOp(fzRetry),
		fzAdvanceOp(3*time.Millisecond), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// A deadline already passed when the clock still reads its origin.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzWith(fzSubmitOp(0, 0), fzDeadline(0)), fzWith(fzPostOp(1, 0), fzDeadline(-time.Millisecond)),
		fzAdvanceOp(time.Millisecond)),
	// Close drains, then its context ends while an exec ignores its own.
	fzEncode(fzConfig{capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzOp{kind: fzClose}, fzSubmitOp(2, 0),
		fzFinishOp(fzOK), fzOp{kind: fzCloseAbort}, fzFinishOp(fzOK)),
	// A refusing merge and a retry: the successor cannot be absorbed and
	// waits behind the retry, whose waiter then leaves.
	fzEncode(fzConfig{merge: 2, capacity: 4, maxAttempts: 3},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(0, 0), fzFinishOp(fzRetry),
		fzOp{kind: fzTicketCancel, idx: 0}, fzFinishOp(fzOK), fzFinishOp(fzOK)),

	// Priorities at the extremes, with aging: higher
	// runs first for every pair of int priorities at every aging, where
	// priority × aging leaves int64. Each submits the lower priority first,
	// so that a tie (arrival order) would run it first.
	//
	// Kubernetes' system-cluster-critical and system-node-critical at 5s.
	fzEncode(fzConfig{aging: 5 * time.Second, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 2000000000), fzSubmitOp(2, 2000001000),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// 1e9 against 2e9 at 10s, and one level (10s of waiting) against 1.5s
	// of waiting.
	fzEncode(fzConfig{aging: 10 * time.Second, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 1000000000), fzSubmitOp(2, 2000000000),
		fzAdvanceOp(1500*time.Millisecond), fzSubmitOp(3, 2000000001),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// The pair that straddles MaxInt64 / 5s, and the extremes at an hour.
	fzEncode(fzConfig{aging: 5 * time.Second, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 1844674407), fzSubmitOp(2, 1844674408), fzSubmitOp(3, -1844674408),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	fzEncode(fzConfig{aging: time.Hour, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, math.MaxInt-1), fzSubmitOp(2, math.MaxInt), fzSubmitOp(3, math.MinInt),
		fzSubmitOp(3, math.MinInt+1), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// The longest aging there is: every product needs 127 bits.
	fzEncode(fzConfig{aging: math.MaxInt64, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, math.MinInt), fzSubmitOp(2, math.MinInt+1), fzSubmitOp(3, math.MaxInt-1),
		fzAdvanceOp(1500*time.Millisecond), fzSubmitOp(1, math.MaxInt),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Shedding compares extremes exactly too: a droppable
	// system-cluster-critical call is evicted for a system-node-critical
	// newcomer, and a system-cluster-critical newcomer is refused when the
	// droppable call is system-node-critical.
	fzEncode(fzConfig{aging: 5 * time.Second, capacity: 2, maxAttempts: 1},
		fzSubmitOp(0, 0), fzWith(fzPostOp(1, 2000000000), fzDrop()), fzSubmitOp(2, 2000001000),
		fzFinishOp(fzOK), fzWith(fzPostOp(3, 2000001000), fzDrop()), fzSubmitOp(1, 2000000000),
		fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// A merge that finds the incoming call moot (SkipIncoming, plain and
	// wrapped): the submission ends Skipped at once and the pending call
	// keeps its value, priority, deadline and label; a refusal (3) in
	// between.
	fzEncode(fzConfig{merge: 3, labels: true, aging: time.Millisecond, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(0, 0), fzPostOp(0, 0), fzWith(fzSubmitOp(0, 5), fzDeadline(time.Millisecond)),
		fzSubmitOp(1, 0), fzSubmitOp(2, 0), fzPostOp(3, 0), fzWith(fzPostOp(0, 10), fzDeadline(500*time.Microsecond)),
		fzAdvanceOp(time.Millisecond), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// A retry whose successor is moot: the successor ends Skipped (hook
	// too), the retry runs alone.
	// (Values are op index + 1: the successor is 5 + 7 = 12.)
	fzEncode(fzConfig{merge: 3, capacity: 4, maxAttempts: 3},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzPostOp(2, 0), fzSubmitOp(3, 0), fzSubmitOp(0, 0), fzPostOp(1, 0),
		fzPostOp(0, 0), fzFinishOp(fzRetry), fzAdvanceOp(time.Millisecond),
		fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK)),
	// Labels: a submission that raises a pending call's priority brings its
	// label; one that does not, or leaves, changes nothing.
	fzEncode(fzConfig{merge: 1, labels: true, capacity: 4, maxAttempts: 1},
		fzSubmitOp(0, 0), fzSubmitOp(1, 0), fzSubmitOp(1, 5), fzSubmitOp(1, 5), fzPostOp(1, 10),
		fzOp{kind: fzTicketCancel, idx: 2}, fzSubmitOp(1, 1), fzFinishOp(fzOK), fzFinishOp(fzOK)),
}

// fzRuleSeeds are hand-written cases for Config.Follow and the tenants
// (quotas, adoption, the pick across tenants), each with the rules the
// model must see it exercise (TestFuzzSeedRules). A submission's value is
// its op's index + 1; fzPad spaces the ops so that the values fall where
// fzFollow and fzMerge act.
var fzRuleSeeds = []struct {
	name  string
	rules []string
	data  []byte
}{
	{
		// Behind k0's call in flight (1): 2 becomes the successor as Follow
		// rewrites it (102); 3 is rewritten knowing a call is pending
		// (10003) and merged into it (10105); 9 is moot, 13 refused, 17
		// panics (a call is pending); 18, of a newer generation, is not
		// asked (it would be moot) and supersedes both; 19, of that
		// generation, is asked about the superseded call still in flight.
		"follow",
		[]string{fzEvFollowAlone, fzEvFollowMerged, fzEvFollowSkip, fzEvFollowRefuse, fzEvFollowPanic, fzEvSupersedeInFlight},
		fzEncode(fzConfig{merge: 1, follow: true, capacity: 4, maxAttempts: 1}, fzSeq(
			fzSubmitOp(0, 0), fzSubmitOp(0, 0), fzPostOp(0, 0), fzPad(5),
			fzSubmitOp(0, 0), fzPad(3), fzSubmitOp(0, 0), fzPad(3), fzSubmitOp(0, 0),
			fzWith(fzSubmitOp(0, 0), fzGen(1)), fzWith(fzSubmitOp(0, 0), fzGen(1)),
			fzFinishOp(fzOK), fzFinishOp(fzOK))...),
	},
	{
		// With Follow, Moot: 23, for a key without a call, is moot and
		// ends Skipped, queuing nothing; Moot panics for 29, which is
		// refused; 30 is queued and runs.
		"moot",
		[]string{fzEvMoot, fzEvMootPanic},
		fzEncode(fzConfig{merge: 1, follow: true, capacity: 4, maxAttempts: 1}, fzSeq(
			fzPad(22), fzSubmitOp(1, 0), fzPad(5), fzPostOp(2, 0), fzPostOp(3, 0),
			fzFinishOp(fzOK))...),
	},
	{
		// Tenant b may queue one call. Its submission of priority 5 takes
		// over tenant a's pending call of k2: b's droppable post (k1) makes
		// room, as the call would run before it; for k3, b's only call is
		// k2, which is not droppable: refused, k3 stays a's.
		"adopt by outranking",
		[]string{fzEvAdoptOutrankEvict, fzEvAdoptOutrankRefuse},
		fzEncode(fzConfig{merge: 1, capacity: 4, maxAttempts: 1, tenants: true, quota: [3]int{0, 0, 1}, weight: [3]int{1, 1, 1}}, fzSeq(
			fzSubmitOp(0, 0), fzWith(fzPostOp(1, 0), fzTenant(2), fzDrop()),
			fzWith(fzSubmitOp(2, 0), fzTenant(1)), fzWith(fzSubmitOp(2, 5), fzTenant(2)),
			fzWith(fzSubmitOp(3, 0), fzTenant(1)), fzWith(fzSubmitOp(3, 5), fzTenant(2)),
			fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK))...),
	},
	{
		// The same with ReplacePending at a priority that does not outrank
		// the pending call: 7 replaces a's k2 (priority 5), which moves to b
		// and evicts b's droppable post, decided after the merge; 14
		// (wrapped) would replace a's k3 but b has no room: refused, and k3
		// runs with its own value (8).
		"adopt by replacing",
		[]string{fzEvAdoptReplaceEvict, fzEvAdoptReplaceRefuse},
		fzEncode(fzConfig{merge: 3, capacity: 4, maxAttempts: 1, tenants: true, quota: [3]int{0, 0, 1}, weight: [3]int{1, 1, 1}}, fzSeq(
			fzSubmitOp(0, 0), fzWith(fzPostOp(1, 0), fzTenant(2), fzDrop()),
			fzWith(fzSubmitOp(2, 5), fzTenant(1)), fzPad(3), fzWith(fzSubmitOp(2, 0), fzTenant(2)),
			fzWith(fzSubmitOp(3, 5), fzTenant(1)), fzPad(5), fzWith(fzSubmitOp(3, 0), fzTenant(2)),
			fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK))...),
	},
	{
		// The pick across tenants: a (weight 2) and b start at one pass,
		// so their calls' arrival decides; then a's pass is ahead; then
		// a's call of priority 0, aged 3ms, outranks b's of priority 1.
		"pick",
		[]string{fzEvPickOrder, fzEvPickPass, fzEvPickLevel},
		fzEncode(fzConfig{aging: time.Millisecond, capacity: 4, maxAttempts: 1, tenants: true, weight: [3]int{1, 2, 1}}, fzSeq(
			fzSubmitOp(0, 0), fzWith(fzSubmitOp(1, 0), fzTenant(1)), fzWith(fzSubmitOp(2, 0), fzTenant(2)),
			fzWith(fzSubmitOp(3, 0), fzTenant(1)), fzFinishOp(fzOK), fzFinishOp(fzOK),
			fzAdvanceOp(3*time.Millisecond), fzWith(fzSubmitOp(0, 1), fzTenant(2)),
			fzFinishOp(fzOK), fzFinishOp(fzOK), fzFinishOp(fzOK))...),
	},
	{
		// A retry of tenant a absorbs b's more urgent successor and moves
		// to b; its next retry is replaced by a's successor (7), and moves
		// back to a.
		"adopt on retry",
		[]string{fzEvAdoptOnRetryAbsorb, fzEvAdoptOnRetryReplace},
		fzEncode(fzConfig{merge: 3, capacity: 4, maxAttempts: 3, tenants: true, weight: [3]int{1, 1, 1}}, fzSeq(
			fzWith(fzSubmitOp(0, 0), fzTenant(1)), fzWith(fzSubmitOp(0, 5), fzTenant(2)), fzFinishOp(fzRetry),
			fzAdvanceOp(time.Millisecond), fzPad(2), fzWith(fzSubmitOp(0, 0), fzTenant(1)), fzFinishOp(fzRetry),
			fzFinishOp(fzOK))...),
	},
	{
		// Quotas of new calls and retries: k0's retry evicts b's droppable
		// post; a new call of b is refused while the retry waits; k0's next
		// retry finds b's room taken by a call it cannot evict, and gives
		// up; a new call of b evicts b's droppable post.
		"quota",
		[]string{fzEvQuotaRetryEvict, fzEvQuotaNewRefuse, fzEvQuotaRetryGiveUp, fzEvQuotaNewEvict},
		fzEncode(fzConfig{capacity: 4, maxAttempts: 3, tenants: true, quota: [3]int{0, 0, 1}, weight: [3]int{1, 1, 1}}, fzSeq(
			fzWith(fzSubmitOp(0, 0), fzTenant(2)), fzWith(fzPostOp(1, 0), fzTenant(2), fzDrop()), fzFinishOp(fzRetry),
			fzWith(fzSubmitOp(2, 0), fzTenant(2)), fzAdvanceOp(time.Millisecond),
			fzWith(fzSubmitOp(2, 0), fzTenant(2)), fzFinishOp(fzRetry),
			fzWith(fzPostOp(3, 0), fzTenant(2), fzDrop()), fzWith(fzSubmitOp(1, 5), fzTenant(2)),
			fzFinishOp(fzOK), fzFinishOp(fzOK))...),
	},
}

// TestFuzzSeedRules: each of fzRuleSeeds exercises the rules it is there
// for, as the model notes them, so that a change to the codec or to the
// model cannot quietly make it a seed that tests something else.
func TestFuzzSeedRules(t *testing.T) {
	for _, s := range fzRuleSeeds {
		t.Run(s.name, func(t *testing.T) {
			var notes []string
			synctest.Test(t, func(t *testing.T) { notes = fzRun(t, s.data) })
			for _, r := range s.rules {
				if !slices.Contains(notes, r) {
					t.Errorf("the seed does not exercise %q; it does %q", r, notes)
				}
			}
		})
	}
}
