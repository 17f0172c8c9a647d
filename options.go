package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch/internal/band"
	"github.com/coalescer/dispatch/internal/execctx"
	"github.com/coalescer/dispatch/internal/sat"
	"github.com/coalescer/dispatch/internal/tokens"
)

// Config configures a Dispatcher; its type parameters type every
// callback. A zero field means its default, and New reports a field out of
// range by name. The callbacks are user code (package documentation).
type Config[K comparable, T any] struct {
	Workers int // concurrent executions (0 means 16; at most 65 536)
	// RateLimit, if set, bounds executions per second (see RateLimiter).
	// New refuses a NaN or negative limit, and a *rate.Limiter of burst 0
	// with a finite limit; a nil *rate.Limiter means no limit. New asks
	// the QPS of a limiter that has one (RateLimiter): one that panics
	// there is refused too.
	RateLimit RateLimiter
	// Capacity bounds keys with a call queued or running (0 means 10 000).
	// A new key beyond it evicts the worst queued droppable call if it
	// would run before it, else is refused with a *BackpressureError.
	Capacity int
	// Merge coalesces a submission into its key's pending call, under the
	// lock, and returns the call to run: a combination, or either one (an
	// update: attempts and backoff are kept); or SkipIncoming,
	// ReplacePending, or another error, which refuses the submission
	// (ErrMergeRejected). nil: the incoming wins. A submission made while
	// its key's call runs is merged into its retry, or else runs after it.
	// One whose tenant has no room for the merged call
	// (TenantConfig.MaxQueued) is refused, leaving the pending call as it was.
	Merge func(pending, incoming T) (T, error)
	// Follow, if set, decides under the lock a submission made while its
	// key's call is in flight (started, and not ended, cancelled,
	// superseded or expired): running is that call; pending, whether a call
	// waits behind it, into which Merge then merges Follow's result. It
	// returns the call to go on with, SkipIncoming to end the submission
	// Skipped (the call in flight makes it moot), or another error to
	// refuse it (ErrMergeRejected); a result a bound then refuses is
	// dropped. Not asked for a newer generation. Fast, and never calling
	// the Dispatcher, like Merge. nil: such submissions go on as they are.
	Follow func(running, incoming T, pending bool) (T, error)
	// Moot, if set, is asked under the lock about a submission for a key
	// that has no call (nothing queued, out a backoff or in flight: Busy
	// would report false). If it reports that the call would change
	// nothing, no call is made: the submission ends Skipped at once (Post
	// returns nil; a Ticket holds the outcome), before any bound is
	// checked. Asked in the step that admits the call, it decides what
	// Busy and a test before Post cannot: no call for the key is admitted
	// between the two. A panic in it refuses the submission with the
	// *PanicError. Fast, and never calling the Dispatcher, like Merge.
	Moot func(key K, call T) bool
	// NoOp reports a call that would change nothing: it ends Skipped
	// without executing. It runs before each execution, and in Amend,
	// with no context to end it: fast, never blocking, like Merge. A test
	// that needs the execution's context belongs in exec, which returns
	// SkipCall.
	NoOp func(key K, call T) bool
	// Classify judges a failed execution; an error from a call whose own
	// context ended is never retried, and one from an attempt that
	// outlived RetryPolicy.AttemptTimeout is retried without asking it.
	// nil means DefaultClassifier.
	Classify func(error) Class
	Retry    RetryPolicy
	// OnDone fires once per finished call, after its waiters were told:
	// the "re-evaluate this object" event. Observer.OnFinish is the same
	// event untyped, for metrics adapters that serve any K and T.
	OnDone   func(Result[K, T])
	Observer Observer

	// MaxWaiters bounds live tickets, counting Sync-mode Posts while they
	// run (0 means 4 × Capacity). A Submit that Merge, Follow or Moot skips
	// ends at once and holds none: it is accepted at the bound. One of a
	// newer generation has the room of the tickets it ends Stale.
	MaxWaiters int
	Aging      time.Duration // a wait of Aging raises a call one level (0 means 1s)
	// AgingBand groups priorities into bands of this many levels (0 means
	// 10; 1 is strict priority). A call never runs before a ready call of
	// a higher band, however long it waited: put call types that must never
	// overtake one another in different bands (a binding at 10, a status
	// patch at 0). Within a band a call's level is its offset plus
	// floor(wait / Aging): priority p runs before any q > p arriving over
	// (q−p) × Aging after it, and behind an endless stream at q within
	// about (q−p+1) × Aging while workers keep up; under overload, behind
	// every call at q queued before it or within (q−p) × Aging after it.
	// At equal levels tenants take turns by TenantConfig.Weight, then
	// arrival decides, so a call of another tenant at q shares p's level
	// until (q−p+1) × Aging after p arrived, and may run before it: across
	// tenants, read (q−p+1) × Aging where this says (q−p) × Aging.
	AgingBand int
	// Label names a call's kind for the Observer and Stats.Labels, from a
	// small fixed set; it runs once per submission, outside the lock. A call
	// has the label and tenant of its most urgent submission.
	Label func(key K, call T) string
	// BeforeRetry runs with the call's context before a retry or a
	// Recompute re-run, so that no effect happens twice: done means the
	// earlier attempt took effect (the call ends Succeeded, counted in
	// Stats.AlreadyDone); else next is the call to run, maybe rebuilt; an
	// error ends the call Failed.
	BeforeRetry func(ctx context.Context, key K, call T, lastErr error) (next T, done bool, err error)
	// Tenants configures tenants by name ("" for submissions naming
	// none), and DefaultTenant all others.
	Tenants       map[string]TenantConfig
	DefaultTenant TenantConfig
	Breaker       *BreakerPolicy // if set, stops executions after sustained failures
	Start         StartPolicy
	Rollout       RolloutPolicy
}

// StartPolicy decides whether the next execution may start. Its zero value
// keeps no workers, fixes concurrency at Config.Workers and checks
// deadlines.
type StartPolicy struct {
	// ReservedWorkers (less than Config.Workers) are kept for calls whose
	// priority (never raised by aging) is in UrgentPriority's band or
	// above: set it to the most urgent calls' own priority. Other calls
	// may hold the rest, at least one; Sync-mode executions are their callers'.
	ReservedWorkers int
	UrgentPriority  int
	Adaptive        *AdaptivePolicy // if set, adapts concurrency to the server
	// NoDeadlineCheck turns off the check that ends Expired
	// (Stats.Unfinishable), unstarted, a call whose deadline is closer than
	// its label's usual execution time: the DeadlineQuantile (default 0.1)
	// of the last minute's, once there are DeadlineSamples (default 20).
	// Once nothing of a label ran for max(1s, twice the estimate), one
	// refused call starts anyway; if faster, the label's history is dropped.
	NoDeadlineCheck  bool
	DeadlineQuantile float64
	DeadlineSamples  int
}

// RolloutPolicy is the feature gate's lever. Its zero value starts in
// ModeAsync, drains on a switch, and never falls back by itself.
type RolloutPolicy struct {
	Mode Mode // at start-up: the feature gate's position
	// CancelQueued makes a switch to ModeSync end the calls queued before
	// it at once, Canceled with ErrFallback, instead of letting workers
	// drain them (SetMode).
	CancelQueued bool
	Fallback     *FallbackPolicy
}

// SubmitOptions are one submission's settings; the zero value is valid.
type SubmitOptions struct {
	// Priority: higher runs first (Config.AgingBand). A call runs at the
	// highest priority and earliest enqueue time of its live waiters.
	Priority int
	// Deadline, if set, ends this submission Expired when it passes, as
	// does the Submit context's.
	Deadline time.Time
	// Timeout, if positive, is a deadline that long after the submission,
	// as Deadline at time.Now().Add(Timeout) would be, but measured on the
	// dispatcher's own monotonic clock, read once by the submission (as a
	// new key's needs it anyway), so the caller reads no clock for it. With
	// Deadline or a context's deadline too, the earliest holds. A negative
	// Timeout has passed already: the submission is refused with an error
	// matching ErrExpired that names the field.
	Timeout time.Duration
	Tenant  string // who submits (a plugin, a call type): Config.Tenants
	// Generation fences stale work for the key (the scheduling attempt): a
	// newer one supersedes older ones (their queued call ends Stale, their
	// running one is cancelled), and, while the key is tracked, an older
	// one is refused (ErrStale). A call waiting out a retry's backoff is
	// queued: it ends Stale, and the newer one does not inherit its
	// backoff or attempts; it runs as a new call would.
	Generation uint64
	// IdempotencyKey names the operation for servers that deduplicate by
	// it (see IdempotencyKey); a different one than the pending call's is
	// refused with ErrMergeRejected.
	IdempotencyKey string
	// Droppable marks work that can be rebuilt, so may be shed under load;
	// a call is droppable if every submission in it is.
	Droppable bool
}

// IdempotencyKey returns the SubmitOptions.IdempotencyKey of the call that
// ctx (an exec context) runs, the same on every attempt.
func IdempotencyKey(ctx context.Context) string {
	s, _ := ctx.Value(execctx.IdemKey{}).(string)
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
	band  int64 // width of a priority band: AgingBand
	// urgent is the first priority of Start.UrgentPriority's band: a call
	// at or above it is urgent. Aging never makes a call urgent, as aging
	// stays within bands.
	urgent int
}

// validate checks c and fills in its defaults. Errors name the field.
func (c Config[K, T]) validate() (settings[K, T], error) {
	s := settings[K, T]{Config: c}
	steps := []func() error{
		s.sizes, s.ordering, s.Retry.validate, s.limiter,
		func() error { return validPolicy(&s.Breaker, (*BreakerPolicy).validate) },
		s.startPolicy, s.rollout, s.tenants,
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
	s.band = int64(s.AgingBand)
	return nil
}

// limiter treats a nil pointer as no limit and checks the rest.
func (s *settings[K, T]) limiter() error {
	if tokens.IsNil(s.RateLimit) {
		s.RateLimit = nil
		return nil
	}
	if err := tokens.Check(s.RateLimit); err != nil {
		return fmt.Errorf("dispatch: Config.RateLimit: %w", err)
	}
	return nil
}

// startPolicy checks and defaults Config.Start.
func (s *settings[K, T]) startPolicy() error {
	p := &s.Start
	switch {
	case p.ReservedWorkers < 0 || p.ReservedWorkers >= s.Workers:
		return fieldErr("Start.ReservedWorkers", p.ReservedWorkers, fmt.Sprintf("must be in [0, Workers) = [0, %d)", s.Workers))
	case p.DeadlineQuantile < 0 || p.DeadlineQuantile > 1 || p.DeadlineQuantile != p.DeadlineQuantile:
		return fieldErr("Start.DeadlineQuantile", p.DeadlineQuantile, "must be in [0, 1]")
	case p.DeadlineSamples < 0:
		return fieldErr("Start.DeadlineSamples", p.DeadlineSamples, "must not be negative")
	}
	s.urgent = int(max(band.Start(int64(p.UrgentPriority), s.band), math.MinInt))
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
