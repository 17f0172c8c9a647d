package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
)

// Defaults for the Config fields left zero. They suit a scheduler's API
// dispatcher; tune them to the API server's capacity.
const (
	// DefaultWorkers is the number of workers when Config.Workers is 0.
	DefaultWorkers = 16
	// DefaultCapacity is the bound on tracked keys when Config.Capacity is 0.
	DefaultCapacity = 10000
	// DefaultWaitersPerKey is the multiple of the capacity that bounds live
	// tickets when Config.MaxWaiters is 0.
	DefaultWaitersPerKey = 4
	// DefaultAging is the aging interval when Config.Aging is 0: a waiting
	// call gains one priority level per second.
	DefaultAging = time.Second
	// DefaultAgingBand is the width of a priority band when
	// Config.AgingBand is 0: priorities ten apart never overtake each
	// other.
	DefaultAgingBand = 10
)

// Config configures a Dispatcher. It carries the Dispatcher's key and call
// types, so every callback is checked by the compiler. Every field's zero
// value means its default, so Config[K, T]{} is a working configuration;
// New reports a value out of range as an error naming the field.
//
// The callbacks (Merge, NoOp, Label, OnDone, Classify, BeforeRetry, the
// Observer) are user code the dispatcher calls; the package documentation
// states what they may do.
type Config[K comparable, T any] struct {
	// Workers bounds concurrent executions: the number of worker
	// goroutines, started on first use, at most 65 536. 0 means
	// DefaultWorkers.
	Workers int
	// RateLimit, if set, bounds the rate of executions (API QPS). Each
	// execution takes one token, before its call is chosen (see
	// RateLimiter); a coalesced submission costs none. nil, or a nil
	// pointer (a *rate.Limiter left unset), means no limit. New refuses a
	// limiter that is not a rate (a NaN or negative limit or QPS) or can
	// grant no token at all (a *rate.Limiter of burst 0 and a finite
	// limit); one that grants its burst and then stops, or is paused at
	// run time, holds executions until it grants again.
	RateLimit RateLimiter
	// Reserve keeps workers free for urgent calls, so that a bind finds a
	// worker whatever low-priority work is doing to the rest. The zero
	// value reserves none.
	Reserve Reservation
	// Adaptive, if set, adapts the number of concurrent executions between
	// a floor and Workers to what the API server says. nil means Workers
	// run whenever there is work.
	Adaptive *AdaptivePolicy
	// StartCheck keeps calls that cannot finish by their deadline from
	// starting. The zero value turns it on with conservative defaults.
	StartCheck StartCheck

	// Capacity bounds the number of tracked keys (keys with a call queued
	// or in flight). A submission for a new key beyond it evicts the worst
	// queued droppable call (SubmitOptions.Droppable; lowest effective
	// priority, then newest) if the newcomer would run before it — that
	// call's waiters end Dropped — and is otherwise refused with a
	// *BackpressureError of Bound BoundCapacity. A submission that
	// coalesces into a tracked key needs no capacity. Non-droppable and
	// in-flight calls are never shed. 0 means DefaultCapacity.
	Capacity int
	// MaxWaiters bounds the number of live tickets (Submit callers waiting
	// for an outcome), so memory stays bounded even when many callers pile
	// onto one key. Fire-and-forget submissions (Post) hold no ticket and
	// are not counted. 0 means DefaultWaitersPerKey × Capacity.
	MaxWaiters int
	// Aging is how fast a waiting call gains priority over the other calls
	// of its priority band (AgingBand): one level per interval. Within a
	// band, a call of priority p that waits behind an endless stream of
	// priority q > p runs within about (q−p+1) × Aging. 0 means
	// DefaultAging.
	Aging time.Duration
	// AgingBand groups priorities into bands of this many consecutive
	// levels — [0, AgingBand), [AgingBand, 2×AgingBand), …, and likewise
	// below 0 — and aging works only within a band: a call never runs
	// before a ready call of a higher band, however long it has waited,
	// and runs whenever no call of a higher band is ready. Give call types
	// that must never overtake one another priorities in different bands
	// (a binding at 10, a status patch at 0), and grade calls of one type
	// within a band. 1 is strict priority: every priority is a band of its
	// own, and nothing ages. 0 means DefaultAgingBand. A band spans at
	// most 2⁶² ns of aging ((AgingBand−1) × Aging, 146 years); a wider one
	// is narrowed to that.
	AgingBand int
	// Tenants configures named tenants (SubmitOptions.Tenant): quotas,
	// in-flight caps and weights. The empty name is the tenant of
	// submissions that give none.
	Tenants map[string]TenantConfig
	// DefaultTenant configures the tenants Tenants does not name.
	DefaultTenant TenantConfig

	// Merge decides how a submission is coalesced into the pending call
	// for its key. It gets the pending call and the incoming one and
	// returns the call that will run: a combination of both, or either
	// one unchanged (overwrite). If it returns SkipIncoming (or an error
	// wrapping it), the pending call makes the incoming one moot: the
	// incoming submission ends Skipped at once and the pending call stays
	// as it was. If it returns ReplacePending (or an error wrapping it)
	// with the incoming call, that call replaces the pending one as a new
	// operation: it starts fresh — no attempts, backoff or last error
	// carried over — in its own tenant and under its own label. If it
	// returns any other error, the incoming submission is refused with an
	// error matching ErrMergeRejected and wrapping it, and the pending call
	// stays as it was. A returned call without an error keeps the pending
	// call's attempts and backoff: it is the same operation, updated. nil
	// means the incoming call replaces the pending one that way.
	//
	// A submission that arrived while its key's call was running waits
	// behind it; if that call is then retried, the waiting one is merged
	// into the retry the same way, except that SkipIncoming (like a
	// refusal) leaves it waiting behind the retry, to run after it: it was
	// never judged against a pending call, and the retry may still fail.
	//
	// Merge runs under the dispatcher's lock, so that a merge and the
	// start of the call it merges into cannot interleave: it must be
	// fast, and must not block or call the Dispatcher. A panic refuses the
	// incoming submission (package documentation, "Callbacks").
	Merge func(pending, incoming T) (T, error)
	// NoOp finds calls that would change nothing. It runs in the worker
	// just before each execution, outside every lock; when it reports
	// true, the call is not executed and ends Skipped, which counts as
	// success. Amend also asks it about the call it rewrote. A panic ends
	// the call Failed. nil means every call runs.
	NoOp func(key K, call T) bool
	// Label names a call for the Observer and Stats.Labels, e.g. by call
	// type ("bind", "status-patch"). Its results must come from a small
	// fixed set, since each becomes a metric label value. It runs on the
	// submitting goroutine, outside the lock, once per submission. A call
	// carries the label of its most urgent submission: one that raises a
	// pending call's priority brings its label (and tenant) along. A panic
	// is counted and leaves the call unlabelled.
	Label func(key K, call T) string
	// OnDone is the completion hook: it fires once per finished call — the
	// "re-evaluate this object" event — with the call's result: its
	// waiters' common state (or Stale for an execution that finished after
	// its call lost every waiter), attempts and timings. It runs outside
	// every lock, after the waiters have been told, on the goroutine that
	// ended the call (a worker, a submitter, a caller of Cancel or Close),
	// or, for calls the clock ended, on a notifier goroutine of the
	// dispatcher's. It may call the Dispatcher; a panic is counted
	// (package documentation, "Callbacks").
	OnDone func(Result[K, T])

	// Classify judges the error of a failed execution: Retry, Permanent or
	// Recompute. It runs in the worker, outside every lock. An error from
	// a call whose own context ended (its waiters left, it was superseded,
	// the dispatcher closed) is never classified or retried. A panic ends
	// the call Failed with a *PanicError wrapping the error being judged.
	// nil means DefaultClassifier.
	Classify func(error) Class
	// Retry bounds retries; its zero fields mean their defaults.
	Retry RetryPolicy
	// BeforeRetry runs in the worker before every retry and before
	// re-running a Recompute failure, outside every lock, with the call's
	// context. It checks the earlier outcome so that no effect happens
	// twice:
	//
	//   - done = true: the earlier attempt took effect after all (the
	//     object exists, the pod is bound). The call ends Succeeded without
	//     another execution; Stats.AlreadyDone counts it.
	//   - otherwise next is the call to run: the same one, or one rebuilt
	//     from fresh state (the Recompute path). It is what Result.Call
	//     reports.
	//   - err != nil: the call ends Failed with a *RetryError whose Reason
	//     is GiveUpBeforeRetry.
	//
	// A panic ends the call Failed. nil means retries run the call as it
	// is, and a Recompute failure ends Failed.
	BeforeRetry func(ctx context.Context, key K, call T, lastErr error) (next T, done bool, err error)
	// Breaker, if set, enables a circuit breaker: after sustained
	// retryable failures it stops executions for a cool-down, then lets
	// probes through before resuming. nil means no breaker.
	Breaker *BreakerPolicy

	// Mode is the mode the dispatcher starts in: a feature gate's position
	// at start-up. The zero value is Async.
	Mode Mode
	// SwitchPolicy says what a switch to Sync does with queued calls, for
	// SetMode and the fallback alike. The zero value is DrainQueued.
	SwitchPolicy SwitchPolicy
	// Fallback, if set, switches the dispatcher to Sync by itself when the
	// async path is doing harm. nil means only SetMode switches.
	Fallback *FallbackPolicy
	// Observer, if set, receives the dispatcher's events, for metrics. Its
	// methods may call the Dispatcher; a panic is counted (package
	// documentation, "Callbacks").
	Observer Observer
}

// SubmitOptions are the per-submission settings. The zero value means
// priority 0, no deadline, no tenant, generation 0, no idempotency key, not
// droppable.
type SubmitOptions struct {
	// Priority orders ready calls: higher runs first. A coalesced call runs
	// at the highest priority of its live waiters. With aging, a call gains
	// one level per aging interval it waits.
	Priority int
	// Deadline, if set, ends this submission as Expired when it passes. The
	// earlier of Deadline and the Submit context's deadline applies. A call's
	// execution context carries the latest deadline of its live waiters.
	Deadline time.Time
	// Tenant names who submits (a plugin, a call type) for quotas and
	// fairness. A call belongs to the tenant of its most urgent
	// submission: one that raises a pending call's priority moves the call
	// to its own tenant (without a quota check: the work was already
	// admitted).
	Tenant string
	// Generation fences stale work for the key (for example the scheduling
	// attempt). A newer generation supersedes older ones: their pending call
	// ends Stale and their in-flight execution is cancelled. A submission
	// older than the key's newest is rejected with ErrStale. Generations are
	// compared as numbers, so 0 is the oldest: once a key has been submitted
	// with a generation, keep giving one. They are remembered while the key
	// is tracked.
	Generation uint64
	// IdempotencyKey names the logical operation, for servers that
	// deduplicate by it. It is passed to exec unchanged on every attempt (see
	// IdempotencyKey). A submission with a different non-empty key than the
	// pending call's is rejected with ErrMergeRejected: two distinct
	// operations are never merged.
	IdempotencyKey string
	// Droppable marks work that may be shed under load because it can be
	// rebuilt. A call is droppable only if every submission in it is.
	Droppable bool
}

type idemKey struct{}

// IdempotencyKey returns the SubmitOptions.IdempotencyKey of the call that
// ctx (an exec context) runs, unchanged on every attempt, so that exec can
// pass it to a server that deduplicates by it.
func IdempotencyKey(ctx context.Context) string {
	s, _ := ctx.Value(idemKey{}).(string)
	return s
}

// settings is a validated Config with every default filled in: the one
// copy of the configuration a Dispatcher keeps.
type settings[K comparable, T any] struct {
	Config[K, T]
	aging int64 // ns per priority level within a band
	band  int64 // width of a priority band, narrowed to maxBandSpan
}

// validate checks c and fills in its defaults. Errors name the field.
func (c Config[K, T]) validate() (settings[K, T], error) {
	s := settings[K, T]{Config: c}
	switch {
	case c.Workers < 0 || c.Workers > maxWorkers:
		return s, fieldErr("Workers", c.Workers, fmt.Sprintf("must be in [0, %d]", maxWorkers))
	case c.Capacity < 0:
		return s, fieldErr("Capacity", c.Capacity, "must not be negative")
	case c.MaxWaiters < 0:
		return s, fieldErr("MaxWaiters", c.MaxWaiters, "must not be negative")
	case c.Aging < 0:
		return s, fieldErr("Aging", c.Aging, "must not be negative")
	case c.AgingBand < 0:
		return s, fieldErr("AgingBand", c.AgingBand, "must not be negative")
	case c.Mode > ModeSync:
		return s, fieldErr("Mode", c.Mode, "is not a Mode")
	case c.SwitchPolicy > CancelQueued:
		return s, fieldErr("SwitchPolicy", c.SwitchPolicy, "is not a SwitchPolicy")
	}
	if s.Workers == 0 {
		s.Workers = DefaultWorkers
	}
	if s.Capacity == 0 {
		s.Capacity = DefaultCapacity
	}
	if s.MaxWaiters == 0 {
		s.MaxWaiters = int(sat.Mul(int64(s.Capacity), DefaultWaitersPerKey))
	}
	if s.Aging == 0 {
		s.Aging = DefaultAging
	}
	if s.AgingBand == 0 {
		s.AgingBand = DefaultAgingBand
	}
	s.aging = int64(s.Aging)
	s.band = min(int64(s.AgingBand), maxBandSpan/s.aging+1)
	if s.Classify == nil {
		s.Classify = DefaultClassifier
	}
	var err error
	if s.Retry, err = c.Retry.withDefaults(); err != nil {
		return s, err
	}
	if c.Breaker != nil {
		b, err := c.Breaker.withDefaults()
		if err != nil {
			return s, err
		}
		s.Breaker = &b
	}
	switch {
	case c.Reserve.Workers < 0:
		return s, fieldErr("Reserve.Workers", c.Reserve.Workers, "must not be negative")
	case c.Reserve.Workers >= s.Workers:
		return s, fieldErr("Reserve.Workers", c.Reserve.Workers, fmt.Sprintf("must be less than Workers (%d)", s.Workers))
	}
	if _, off := bandOf(int64(c.Reserve.MinPriority), s.band); c.Reserve.Workers > 0 && off != 0 {
		return s, fieldErr("Reserve.MinPriority", c.Reserve.MinPriority, fmt.Sprintf("must start a priority band (a multiple of AgingBand, %d)", s.band))
	}
	if isNil(c.RateLimit) {
		s.RateLimit = nil
	} else if err := checkLimiter(c.RateLimit); err != nil {
		return s, err
	}
	if c.Adaptive != nil {
		a, err := c.Adaptive.withDefaults(s.Workers)
		if err != nil {
			return s, err
		}
		s.Adaptive = &a
	}
	if s.StartCheck, err = c.StartCheck.withDefaults(); err != nil {
		return s, err
	}
	if c.Fallback != nil {
		f, err := c.Fallback.withDefaults()
		if err != nil {
			return s, err
		}
		s.Fallback = &f
	}
	if err := c.DefaultTenant.check("DefaultTenant"); err != nil {
		return s, err
	}
	for name, tc := range c.Tenants {
		if err := tc.check(fmt.Sprintf("Tenants[%q]", name)); err != nil {
			return s, err
		}
	}
	return s, nil
}

// Reservation keeps Workers of the dispatcher's workers for urgent calls:
// those whose priority — the highest of their live waiters', never raised
// by aging — is at least MinPriority. Other calls may hold at most the rest
// of the workers, and at least one. MinPriority must start a priority band
// (Config.AgingBand), so that every urgent call runs before every other
// call, whatever their ages. It applies to what workers run, on top of
// tenant caps; inline (Sync) executions are their callers' own. Stats
// reports it.
type Reservation struct {
	// Workers is the number of workers kept; 0 keeps none. It must be less
	// than Config.Workers.
	Workers int
	// MinPriority is the priority a call needs to use a kept worker.
	MinPriority int
}

// AdaptivePolicy adapts the number of concurrent executions to the API
// server (Config.Adaptive), in the spirit of TCP Vegas and gradient
// limiters. The limit grows by one for every limit's worth of executions
// within the latency tolerance, and shrinks when the server shows strain:
//
//   - Latency, judged per block of executions (at least 64, and twice the
//     limit), never one by one: when a block's median exceeds Tolerance ×
//     the baseline — the lowest block median of the last Window, what the
//     server does when least loaded — the limit falls in proportion, by a
//     tenth to a half. A server whose latency varies but does not grow
//     with load keeps its full concurrency; one that queues (its latency
//     grows with requests in flight) sheds concurrency until its median is
//     back within the tolerance, so the queue forms in the dispatcher,
//     where priority holds. A server that stays slower for a Window
//     becomes the new baseline, and the limit grows back. The baseline is
//     learnt from lighter load: a dispatcher that has only ever seen the
//     server saturated cannot tell queueing from a slow server.
//   - A timeout: by a quarter.
//   - An answer that carries a Retry-After hint (429, 503): by half. It
//     also holds new executions until the time the server asked for, at
//     most Retry.MaxBackoff, except calls that may use reserved workers
//     (Config.Reserve), which are never held: a binding does not wait out
//     a hold a status patch drew (if the server throttles it too, its own
//     retry waits). The call that got the answer retries after the full
//     Retry-After.
//
// Decreases happen at most once per twice the baseline (and 10ms), so one
// burst of failures counts once. Stats and the observer (OnLimitChange)
// show the limit. The zero value of each field means its default.
type AdaptivePolicy struct {
	// MinWorkers is the floor of the limit (default 1).
	MinWorkers int
	// Tolerance is how many times the baseline a block's median latency
	// may be before it counts as strain (default 2).
	Tolerance float64
	// Window is the span the baseline latency is taken over: how long the
	// dispatcher remembers the server's best (default 30s).
	Window time.Duration
}

func (p AdaptivePolicy) withDefaults(workers int) (AdaptivePolicy, error) {
	switch {
	case p.MinWorkers < 0:
		return p, fieldErr("Adaptive.MinWorkers", p.MinWorkers, "must not be negative")
	case p.MinWorkers > workers:
		return p, fieldErr("Adaptive.MinWorkers", p.MinWorkers, fmt.Sprintf("must not exceed Workers (%d)", workers))
	case p.Tolerance < 0 || math.IsNaN(p.Tolerance) || (p.Tolerance > 0 && p.Tolerance < 1):
		return p, fieldErr("Adaptive.Tolerance", p.Tolerance, "must be at least 1")
	case p.Window < 0:
		return p, fieldErr("Adaptive.Window", p.Window, "must not be negative")
	}
	if p.MinWorkers == 0 {
		p.MinWorkers = 1
	}
	if p.Tolerance == 0 {
		p.Tolerance = 2
	}
	if p.Window == 0 {
		p.Window = 30 * time.Second
	}
	return p, nil
}

// StartCheck keeps a call from starting when its waiters' latest deadline
// is closer than a conservative estimate of its execution time: a low
// quantile of the recent execution times of calls with its label
// (Config.Label). Such a call could only end Expired, so its waiters end
// Expired at once (Stats.Unfinishable counts it) and the worker and token
// go to work that can still succeed. Refused calls add no samples, so that
// the estimate cannot outlive a slow spell, one refused call of a label
// starts anyway — a probe — once nothing of the label has run for
// max(1s, twice the estimate); a probe faster than the estimate drops the
// label's history, and its calls start again. The zero value turns the
// check on.
type StartCheck struct {
	// Disabled turns the check off: every call is started.
	Disabled bool
	// Quantile is the quantile of recent execution times taken as the
	// estimate (default 0.1: nine executions in ten took longer). Its
	// histogram bucket's lower bound is used, so the estimate errs short.
	Quantile float64
	// MinSamples is how many recent executions of the label it needs
	// before it judges (default 20).
	MinSamples int
}

func (c StartCheck) withDefaults() (StartCheck, error) {
	switch {
	case c.Quantile < 0 || c.Quantile > 1 || math.IsNaN(c.Quantile):
		return c, fieldErr("StartCheck.Quantile", c.Quantile, "must be in [0, 1]")
	case c.MinSamples < 0:
		return c, fieldErr("StartCheck.MinSamples", c.MinSamples, "must not be negative")
	}
	if c.Quantile == 0 {
		c.Quantile = 0.1
	}
	if c.MinSamples == 0 {
		c.MinSamples = 20
	}
	return c, nil
}

// fieldErr is the error for a Config field out of range.
func fieldErr(field string, v any, why string) error {
	return fmt.Errorf("dispatch: Config.%s: %v %s", field, v, why)
}

// RetryPolicy bounds how calls are retried (Config.Retry). The zero value of
// each field means its default.
type RetryPolicy struct {
	// MaxAttempts bounds executions per call, first attempt included
	// (default 3; 1 disables retries).
	MaxAttempts int
	// InitialBackoff is the delay before the first retry (default 100ms).
	InitialBackoff time.Duration
	// MaxBackoff caps the computed delay (default 10s), and the hold that
	// a Retry-After puts on other calls (AdaptivePolicy). A server's
	// Retry-After sets the delay of the call that got it in full, bounded
	// by the call's deadline.
	MaxBackoff time.Duration
	// Multiplier grows the delay per retry (default 2).
	Multiplier float64
	// Jitter randomises the delay (default FullJitter).
	Jitter Jitter
	// AttemptTimeout bounds one execution (default: none, only the call's
	// deadline). An attempt that times out is retried like any Retry error.
	AttemptTimeout time.Duration
	// BudgetRatio caps retries at this fraction of first attempts in the
	// last BudgetWindow, so an API outage cannot become a retry storm
	// (default 0.2). math.Inf(1) disables the budget.
	BudgetRatio float64
	// BudgetMin is the number of retries allowed per window whatever the
	// ratio, so a quiet dispatcher can still retry (default 10).
	BudgetMin int
	// BudgetWindow is the window the budget counts over (default 10s).
	BudgetWindow time.Duration
}

// Defaults for RetryPolicy.
const (
	DefaultMaxAttempts    = 3
	DefaultInitialBackoff = 100 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	DefaultMultiplier     = 2.0
	DefaultBudgetRatio    = 0.2
	DefaultBudgetMin      = 10
	DefaultBudgetWindow   = 10 * time.Second
)

func (p RetryPolicy) withDefaults() (RetryPolicy, error) {
	switch {
	case p.MaxAttempts < 0:
		return p, fieldErr("Retry.MaxAttempts", p.MaxAttempts, "must be at least 1 (0 means the default)")
	case p.InitialBackoff < 0:
		return p, fieldErr("Retry.InitialBackoff", p.InitialBackoff, "must not be negative")
	case p.MaxBackoff < 0:
		return p, fieldErr("Retry.MaxBackoff", p.MaxBackoff, "must not be negative")
	case p.AttemptTimeout < 0:
		return p, fieldErr("Retry.AttemptTimeout", p.AttemptTimeout, "must not be negative")
	case p.BudgetWindow < 0:
		return p, fieldErr("Retry.BudgetWindow", p.BudgetWindow, "must not be negative")
	case p.Multiplier < 0 || math.IsNaN(p.Multiplier) || (p.Multiplier > 0 && p.Multiplier < 1):
		return p, fieldErr("Retry.Multiplier", p.Multiplier, "must be at least 1")
	case p.Jitter > JitterNone:
		return p, fieldErr("Retry.Jitter", p.Jitter, "is not a Jitter")
	case p.BudgetRatio < 0 || math.IsNaN(p.BudgetRatio):
		return p, fieldErr("Retry.BudgetRatio", p.BudgetRatio, "must not be negative")
	case p.BudgetMin < 0:
		return p, fieldErr("Retry.BudgetMin", p.BudgetMin, "must not be negative")
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = DefaultInitialBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = DefaultMaxBackoff
	}
	p.MaxBackoff = max(p.MaxBackoff, p.InitialBackoff)
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.BudgetRatio == 0 {
		p.BudgetRatio = DefaultBudgetRatio
	}
	if p.BudgetMin == 0 {
		p.BudgetMin = DefaultBudgetMin
	}
	if p.BudgetWindow == 0 {
		p.BudgetWindow = DefaultBudgetWindow
	}
	return p, nil
}

// BreakerPolicy configures the circuit breaker (Config.Breaker). It trips on
// retryable failures only: Permanent errors, Recompute, and cancellations
// say nothing about the API's health and are not counted. The zero value of
// each field means its default. State changes reach the Observer
// (OnBreakerChange).
type BreakerPolicy struct {
	// ConsecutiveFailures trips the breaker after this many retryable
	// failures in a row (default 5).
	ConsecutiveFailures int
	// FailureRatio trips it when retryable failures reach this fraction of
	// counted executions in Window, once MinSamples were seen (default 0.5;
	// math.Inf(1) disables the ratio rule).
	FailureRatio float64
	// Window is the span FailureRatio is measured over (default 10s).
	Window time.Duration
	// MinSamples is the fewest executions in Window before FailureRatio
	// applies (default 20).
	MinSamples int
	// Cooldown is how long the breaker stays open before probing (default
	// 5s).
	Cooldown time.Duration
	// Probes is how many executions may run at once while half-open
	// (default 1).
	Probes int
	// RefuseDroppable makes submissions of droppable work for a new key
	// fail with ErrCircuitOpen while the breaker is open, instead of
	// queueing behind it.
	RefuseDroppable bool
}

func (p BreakerPolicy) withDefaults() (BreakerPolicy, error) {
	switch {
	case p.ConsecutiveFailures < 0:
		return p, fieldErr("Breaker.ConsecutiveFailures", p.ConsecutiveFailures, "must not be negative")
	case p.MinSamples < 0:
		return p, fieldErr("Breaker.MinSamples", p.MinSamples, "must not be negative")
	case p.Probes < 0:
		return p, fieldErr("Breaker.Probes", p.Probes, "must not be negative")
	case p.Window < 0:
		return p, fieldErr("Breaker.Window", p.Window, "must not be negative")
	case p.Cooldown < 0:
		return p, fieldErr("Breaker.Cooldown", p.Cooldown, "must not be negative")
	case p.FailureRatio < 0 || math.IsNaN(p.FailureRatio) || (p.FailureRatio > 1 && !math.IsInf(p.FailureRatio, 1)):
		return p, fieldErr("Breaker.FailureRatio", p.FailureRatio, "must be in (0, 1] or +Inf")
	}
	if p.ConsecutiveFailures == 0 {
		p.ConsecutiveFailures = 5
	}
	if p.FailureRatio == 0 {
		p.FailureRatio = 0.5
	}
	if p.Window == 0 {
		p.Window = 10 * time.Second
	}
	if p.MinSamples == 0 {
		p.MinSamples = 20
	}
	if p.Cooldown == 0 {
		p.Cooldown = 5 * time.Second
	}
	if p.Probes == 0 {
		p.Probes = 1
	}
	return p, nil
}

// FallbackPolicy switches the dispatcher to Sync by itself when the async
// path is doing harm (Config.Fallback). Each threshold is checked over a
// sliding Window; a zero threshold is not checked, and at least one must be
// set. Crossing any one switches to Sync with the SwitchPolicy, records the
// measured values (Stats.FallbackReason) and tells the observer the
// threshold's SwitchReason.
type FallbackPolicy struct {
	// Window is the span the thresholds are measured over, and how often
	// they are checked (a tenth of it, even while idle). Default 10s; at
	// least 10ms, so that an idle dispatcher wakes at most once a
	// millisecond.
	Window time.Duration
	// MaxBacklog trips when more than this many calls are queued (not in
	// flight).
	MaxBacklog int
	// MaxQueueWaitP99 trips when the 99th percentile of queue wait over the
	// window exceeds it.
	MaxQueueWaitP99 time.Duration
	// MaxFailureRatio trips when failed calls exceed this fraction of the
	// calls finished in the window, once MinSamples have finished.
	MaxFailureRatio float64
	// MinSamples is the fewest finished calls before MaxFailureRatio and
	// MaxQueueWaitP99 apply (default 20).
	MinSamples int
	// MaxBreakerOpen trips when the circuit breaker has been open (or
	// half-open) for longer than this without closing.
	MaxBreakerOpen time.Duration
	// ReturnAfter, if set, switches back to Async this long after an
	// automatic fallback. Zero leaves the return to a person (SetMode).
	ReturnAfter time.Duration
}

// maxWorkers bounds Config.Workers: each worker is a goroutine, started
// with the dispatcher.
const maxWorkers = 1 << 16

// minFallbackWindow is the shortest FallbackPolicy.Window.
const minFallbackWindow = 10 * time.Millisecond

func (p FallbackPolicy) withDefaults() (FallbackPolicy, error) {
	switch {
	case p.Window < 0 || (p.Window > 0 && p.Window < minFallbackWindow):
		return p, fieldErr("Fallback.Window", p.Window, fmt.Sprintf("must be at least %v (0 means the default)", minFallbackWindow))
	case p.MaxQueueWaitP99 < 0:
		return p, fieldErr("Fallback.MaxQueueWaitP99", p.MaxQueueWaitP99, "must not be negative")
	case p.MaxBreakerOpen < 0:
		return p, fieldErr("Fallback.MaxBreakerOpen", p.MaxBreakerOpen, "must not be negative")
	case p.ReturnAfter < 0:
		return p, fieldErr("Fallback.ReturnAfter", p.ReturnAfter, "must not be negative")
	case p.MaxBacklog < 0:
		return p, fieldErr("Fallback.MaxBacklog", p.MaxBacklog, "must not be negative")
	case p.MinSamples < 0:
		return p, fieldErr("Fallback.MinSamples", p.MinSamples, "must not be negative")
	case p.MaxFailureRatio < 0 || p.MaxFailureRatio > 1 || math.IsNaN(p.MaxFailureRatio):
		return p, fieldErr("Fallback.MaxFailureRatio", p.MaxFailureRatio, "must be in [0, 1]")
	case p.MaxBacklog == 0 && p.MaxQueueWaitP99 == 0 && p.MaxFailureRatio == 0 && p.MaxBreakerOpen == 0:
		return p, errors.New("dispatch: Config.Fallback: no threshold set")
	}
	if p.Window == 0 {
		p.Window = 10 * time.Second
	}
	if p.MinSamples == 0 {
		p.MinSamples = 20
	}
	return p, nil
}

// TenantConfig bounds one tenant: a scheduler plugin, a call type, whoever
// submits (Config.Tenants, Config.DefaultTenant). The zero value means no
// quota, no in-flight cap, weight 1.
type TenantConfig struct {
	// MaxQueued caps the tenant's calls waiting to run (ready, in backoff,
	// or behind their key's in-flight call) — its share of capacity, so one
	// tenant cannot fill the queue for the others. Beyond it, a submission
	// that needs a new call evicts the tenant's own worst droppable queued
	// call if the newcomer would run before it, and is otherwise refused
	// with a *BackpressureError of Bound BoundQuota. 0 means no quota.
	MaxQueued int
	// MaxInFlight caps the tenant's concurrent executions, so that (say) a
	// storm of status patches can hold at most this many workers and binds
	// always find one. 0 means no cap beyond the worker count.
	MaxInFlight int
	// Weight is the tenant's share of workers among ready calls of equal
	// effective priority (see the package documentation). 0 means 1;
	// weights beyond 2³² count as 2³².
	Weight int
}

func (c TenantConfig) check(field string) error {
	switch {
	case c.MaxQueued < 0:
		return fieldErr(field+".MaxQueued", c.MaxQueued, "must not be negative")
	case c.MaxInFlight < 0:
		return fieldErr(field+".MaxInFlight", c.MaxInFlight, "must not be negative")
	case c.Weight < 0:
		return fieldErr(field+".Weight", c.Weight, "must not be negative")
	}
	return nil
}
