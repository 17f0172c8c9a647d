package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
)

// Config configures a Dispatcher. It carries the key and call types, so
// every callback is checked by the compiler. Every zero field means its
// default, so Config[K, T]{} works; New reports a value out of range as an
// error naming the field. The first fields are what a first user sets;
// the rest tune it, with Start and Rollout grouping two concerns.
//
// The callbacks are user code: whatever one does — panic, block, exit its
// goroutine, call back in — no outcome is lost, no key is wedged and Close
// returns. A panic in exec, NoOp, BeforeRetry or Classify ends the call
// Failed with a *PanicError (never retried: exec may have done half its
// work); in Merge it refuses the incoming submission; in OnDone, an
// Observer method or Label it is counted (Stats.CallbackPanics) and the
// call goes on. Merge runs under the dispatcher's lock and must not call
// the Dispatcher; every other callback may. A call that would have to wait
// for the very goroutine making it returns ErrReentrant instead of hanging.
type Config[K comparable, T any] struct {
	// Workers bounds concurrent executions: worker goroutines, started on
	// first use. 0 means 16; at most 65 536.
	Workers int
	// RateLimit, if set, bounds executions per second (see RateLimiter).
	// A nil pointer (a *rate.Limiter left unset) means no limit. New
	// refuses a limiter that is not a rate (NaN or negative) or can grant
	// nothing (a *rate.Limiter of burst 0 and a finite limit).
	RateLimit RateLimiter
	// Capacity bounds tracked keys (keys with a call queued or running).
	// A new key beyond it evicts the worst queued droppable call
	// (SubmitOptions.Droppable) if the newcomer would run before it, else
	// is refused with a *BackpressureError. 0 means 10 000.
	Capacity int
	// Merge coalesces a submission into its key's pending call: it returns
	// the call to run — a combination, or either one (an update of the same
	// operation, which keeps the pending call's attempts and backoff). It
	// may instead return SkipIncoming (the incoming submission is moot and
	// ends Skipped at once), ReplacePending with the incoming call (another
	// operation: it starts fresh, in its own tenant and under its own
	// label), or another error, which refuses the incoming submission with
	// ErrMergeRejected. A submission that arrived while its key's call ran
	// is merged into that call's retry the same way, but stays behind it if
	// the merge refuses or finds it moot. nil means the incoming call
	// replaces the pending one as an update. Merge runs under the lock: it
	// must be fast.
	Merge func(pending, incoming T) (T, error)
	// NoOp reports calls that would change nothing: they end Skipped, a
	// success, without executing. It runs just before each execution, and
	// in Amend. nil means every call runs.
	NoOp func(key K, call T) bool
	// Classify judges a failed execution: ClassRetry, ClassPermanent or
	// ClassRecompute. An error from a call whose own context ended is
	// never classified or retried. nil means DefaultClassifier.
	Classify func(error) Class
	// Retry bounds retries.
	Retry RetryPolicy
	// OnDone fires once per finished call — the "re-evaluate this object"
	// event — with its result, typed by K and T, after its waiters were
	// told. The Observer's OnFinish sees the same event untyped, for
	// metrics adapters that work for any K and T.
	OnDone func(Result[K, T])
	// Observer, if set, receives the dispatcher's events, outside the lock.
	Observer Observer

	// MaxWaiters bounds live tickets (Submit callers, and Sync-mode Posts
	// while they run), whatever callers do. 0 means 4 × Capacity.
	MaxWaiters int
	// Aging is how fast a waiting call gains priority over the calls of
	// its priority band: one level per interval. 0 means one second.
	Aging time.Duration
	// AgingBand groups priorities into bands of this many levels:
	// floor(priority / AgingBand). A call never runs before a ready call of
	// a higher band, however long it has waited; within a band, a call of
	// priority p behind an endless stream at q > p runs within about
	// (q−p+1) × Aging. Give call types that must never overtake one another
	// priorities in different bands (a binding at 10, a status patch at 0).
	// 1 is strict priority. 0 means 10. A band is narrowed to span at most
	// 2⁶² ns of aging.
	AgingBand int
	// Label names a call's kind for the Observer and Stats.Labels. It runs
	// once per submission, outside the lock; its values, like tenant
	// names, become metric labels and must come from a small fixed set. A
	// call carries the label and tenant of its most urgent submission.
	Label func(key K, call T) string
	// BeforeRetry runs before a retry or a Recompute re-run, with the
	// call's context, so that no effect happens twice: done = true means
	// the earlier attempt took effect (the call ends Succeeded; Stats
	// counts it in AlreadyDone); else next is the call to run, possibly
	// rebuilt from fresh state; an error ends the call Failed. nil means
	// retries run the call as it is, and a Recompute failure ends Failed.
	BeforeRetry func(ctx context.Context, key K, call T, lastErr error) (next T, done bool, err error)
	// Tenants configures named tenants (SubmitOptions.Tenant): quotas,
	// in-flight caps, weights. "" is the tenant of submissions naming none.
	Tenants map[string]TenantConfig
	// DefaultTenant configures the tenants Tenants does not name.
	DefaultTenant TenantConfig
	// Breaker, if set, stops executions after sustained retryable failures
	// and probes before resuming.
	Breaker *BreakerPolicy
	// Start decides whether the next execution may start.
	Start StartPolicy
	// Rollout is the feature gate's lever: the mode, and the way back.
	Rollout RolloutPolicy
}

// StartPolicy decides whether the next execution may start (Config.Start):
// workers kept for urgent calls, adaptive concurrency, and a deadline
// check. Its zero value keeps no workers, fixes concurrency at
// Config.Workers and turns the deadline check on.
type StartPolicy struct {
	// ReservedWorkers are kept for urgent calls: those whose priority (the
	// highest of their live waiters', never raised by aging) is at least
	// UrgentPriority. Other calls may hold the rest, and at least one
	// worker. It must be less than Config.Workers; inline (Sync)
	// executions are their callers' own.
	ReservedWorkers int
	// UrgentPriority must start a priority band (a multiple of
	// Config.AgingBand), so that every urgent call runs before every other.
	UrgentPriority int
	// Adaptive, if set, adapts concurrency between a floor and
	// Config.Workers to what the server says (see AdaptivePolicy).
	Adaptive *AdaptivePolicy
	// NoDeadlineCheck turns the deadline check off. The check does not
	// start a call whose waiters' latest deadline is closer than its
	// label's usual execution time — the DeadlineQuantile (default 0.1) of
	// the last minute's, once there are DeadlineSamples (default 20): its
	// waiters end Expired at once (Stats.Unfinishable) and the worker goes
	// to work that can succeed. Since refused calls add no samples, one
	// refused call of a label starts anyway once nothing of the label has
	// run for max(1s, twice the estimate); if it is faster than the
	// estimate, the label's history is dropped.
	NoDeadlineCheck  bool
	DeadlineQuantile float64
	DeadlineSamples  int
}

// RolloutPolicy is the feature gate's lever (Config.Rollout): the mode the
// dispatcher starts in, what a switch to ModeSync does with queued calls,
// and an automatic fallback. Its zero value starts in ModeAsync, drains on
// a switch, and never falls back by itself.
type RolloutPolicy struct {
	// Mode is the mode at start-up: a feature gate's position.
	Mode Mode
	// CancelQueued makes a switch to ModeSync (SetMode, or the fallback)
	// end every queued call at once, Canceled with ErrFallback, instead of
	// letting the workers drain them.
	CancelQueued bool
	// Fallback, if set, switches to ModeSync by itself when the async path
	// does harm (see FallbackPolicy).
	Fallback *FallbackPolicy
}

// SubmitOptions are one submission's settings. The zero value means
// priority 0, no deadline, no tenant, generation 0, no idempotency key,
// not droppable.
type SubmitOptions struct {
	// Priority orders ready calls: higher runs first (see Config.AgingBand).
	// A coalesced call runs at the highest priority of its live waiters.
	Priority int
	// Deadline, if set, ends this submission Expired when it passes; the
	// earlier of it and the Submit context's deadline applies.
	Deadline time.Time
	// Tenant names who submits (a plugin, a call type), for quotas and
	// fairness.
	Tenant string
	// Generation fences stale work for the key (the scheduling attempt,
	// say): a newer one supersedes older ones — their queued call ends
	// Stale and their running one is cancelled — and an older one is
	// refused with ErrStale. 0 is the oldest; generations are remembered
	// while the key is tracked.
	Generation uint64
	// IdempotencyKey names the logical operation, for servers that
	// deduplicate by it (see IdempotencyKey). A submission with another
	// non-empty key than the pending call's is refused with
	// ErrMergeRejected.
	IdempotencyKey string
	// Droppable marks work that may be shed under load because it can be
	// rebuilt. A call is droppable only if every submission in it is.
	Droppable bool
}

type idemKey struct{}

// IdempotencyKey returns the SubmitOptions.IdempotencyKey of the call that
// ctx (an exec context) runs, the same on every attempt.
func IdempotencyKey(ctx context.Context) string {
	s, _ := ctx.Value(idemKey{}).(string)
	return s
}

// The defaults of Config's fields, stated in their docs.
const (
	defaultWorkers       = 16
	defaultCapacity      = 10000
	defaultWaitersPerKey = 4
	defaultAging         = time.Second
	defaultAgingBand     = 10
	defaultDeadlineQ     = 0.1
	defaultDeadlineN     = 20
	// maxWorkers bounds Config.Workers: each worker is a goroutine.
	maxWorkers = 1 << 16
)

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
	steps := []func() error{
		s.sizes, s.ordering, s.Retry.validate, s.limiter,
		func() error { return validPolicy(&s.Breaker, (*BreakerPolicy).validate) },
		s.start, s.rollout, s.tenants,
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return s, err
		}
	}
	if s.Classify == nil {
		s.Classify = DefaultClassifier
	}
	return s, nil
}

// sizes checks and defaults the worker and capacity bounds.
func (s *settings[K, T]) sizes() error {
	switch {
	case s.Workers < 0 || s.Workers > maxWorkers:
		return fieldErr("Workers", s.Workers, fmt.Sprintf("must be in [0, %d]", maxWorkers))
	case s.Capacity < 0:
		return fieldErr("Capacity", s.Capacity, "must not be negative")
	case s.MaxWaiters < 0:
		return fieldErr("MaxWaiters", s.MaxWaiters, "must not be negative")
	}
	s.Workers = cmp.Or(s.Workers, defaultWorkers)
	s.Capacity = cmp.Or(s.Capacity, defaultCapacity)
	s.MaxWaiters = cmp.Or(s.MaxWaiters, int(sat.Mul(int64(s.Capacity), defaultWaitersPerKey)))
	return nil
}

// ordering checks and defaults aging and bands.
func (s *settings[K, T]) ordering() error {
	switch {
	case s.Aging < 0:
		return fieldErr("Aging", s.Aging, "must not be negative")
	case s.AgingBand < 0:
		return fieldErr("AgingBand", s.AgingBand, "must not be negative")
	}
	s.Aging = cmp.Or(s.Aging, defaultAging)
	s.AgingBand = cmp.Or(s.AgingBand, defaultAgingBand)
	s.aging = int64(s.Aging)
	s.band = min(int64(s.AgingBand), maxBandSpan/s.aging+1)
	return nil
}

// limiter treats a nil pointer as no limit and checks the rest.
func (s *settings[K, T]) limiter() error {
	if isNil(s.RateLimit) {
		s.RateLimit = nil
		return nil
	}
	return checkLimiter(s.RateLimit)
}

// start checks and defaults Config.Start.
func (s *settings[K, T]) start() error {
	p := &s.Start
	switch {
	case p.ReservedWorkers < 0 || p.ReservedWorkers >= s.Workers:
		return fieldErr("Start.ReservedWorkers", p.ReservedWorkers, fmt.Sprintf("must be in [0, Workers) = [0, %d)", s.Workers))
	case p.DeadlineQuantile < 0 || p.DeadlineQuantile > 1 || p.DeadlineQuantile != p.DeadlineQuantile:
		return fieldErr("Start.DeadlineQuantile", p.DeadlineQuantile, "must be in [0, 1]")
	case p.DeadlineSamples < 0:
		return fieldErr("Start.DeadlineSamples", p.DeadlineSamples, "must not be negative")
	}
	if _, off := bandOf(int64(p.UrgentPriority), s.band); p.ReservedWorkers > 0 && off != 0 {
		return fieldErr("Start.UrgentPriority", p.UrgentPriority, fmt.Sprintf("must start a priority band (a multiple of AgingBand, %d)", s.band))
	}
	p.DeadlineQuantile = cmp.Or(p.DeadlineQuantile, defaultDeadlineQ)
	p.DeadlineSamples = cmp.Or(p.DeadlineSamples, defaultDeadlineN)
	return validPolicy(&p.Adaptive, func(a *AdaptivePolicy) error { return a.validate(s.Workers) })
}

// rollout checks and defaults Config.Rollout.
func (s *settings[K, T]) rollout() error {
	if s.Rollout.Mode > ModeSync {
		return fieldErr("Rollout.Mode", s.Rollout.Mode, "is not a Mode")
	}
	return validPolicy(&s.Rollout.Fallback, (*FallbackPolicy).validate)
}

// tenants checks every tenant's settings.
func (s *settings[K, T]) tenants() error {
	if err := s.DefaultTenant.check("DefaultTenant"); err != nil {
		return err
	}
	for name, tc := range s.Tenants {
		if err := tc.check(fmt.Sprintf("Tenants[%q]", name)); err != nil {
			return err
		}
	}
	return nil
}

// validPolicy validates an optional policy in a copy of its own, so that
// filling in defaults never writes the caller's value.
func validPolicy[P any](p **P, validate func(*P) error) error {
	if *p == nil {
		return nil
	}
	c := **p
	*p = &c
	return validate(&c)
}

// fieldErr is the error for a Config field out of range.
func fieldErr(field string, v any, why string) error {
	return fmt.Errorf("dispatch: Config.%s: %v %s", field, v, why)
}
