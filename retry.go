package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"syscall"
	"time"
)

// Class is the judgement on a failed execution.
type Class uint8

const (
	// Permanent: retrying cannot help (invalid, unauthorised, forbidden).
	// The call ends Failed. It is the zero Class, so a classifier that does
	// not know an error fails safe.
	Permanent Class = iota
	// Retry: a transient failure (timeout, connection reset, 429, 5xx). The
	// call waits out a backoff in the queue, then runs again.
	Retry
	// Recompute: the call is no longer valid as built (a conflict); it must
	// be rebuilt from fresh state by the before-retry hook
	// (WithBeforeRetry) before it runs again. Without that hook it ends
	// Failed.
	Recompute
)

func (c Class) String() string {
	switch c {
	case Permanent:
		return "Permanent"
	case Retry:
		return "Retry"
	case Recompute:
		return "Recompute"
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// DefaultClassifier judges plain Go errors: attempt timeouts
// (context.DeadlineExceeded from the attempt itself), net.Error timeouts,
// ECONNREFUSED, ECONNRESET, io.ErrUnexpectedEOF and any error carrying a
// server hint (a RetryAfter() time.Duration method) are Retry; anything else
// is Permanent. Adapters for a particular API (Kubernetes status codes, say)
// supply their own classifier and may fall back to this one.
func DefaultClassifier(err error) Class {
	var ne net.Error
	var hint interface{ RetryAfter() time.Duration }
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, &ne) && ne.Timeout(),
		errors.As(err, &hint):
		return Retry
	}
	return Permanent
}

// retryAfter returns a server's hint for the next delay, if err carries
// one.
func retryAfter(err error) (time.Duration, bool) {
	var hint interface{ RetryAfter() time.Duration }
	if errors.As(err, &hint) {
		if d := hint.RetryAfter(); d > 0 {
			return d, true
		}
	}
	return 0, false
}

// Jitter selects how backoff delays are randomised.
type Jitter uint8

const (
	// FullJitter waits a uniform random time in [0, backoff]. It spreads
	// retries best; it is the default.
	FullJitter Jitter = iota
	// EqualJitter waits backoff/2 plus a uniform random time in
	// [0, backoff/2]: never much less than the backoff.
	EqualJitter
	// NoJitter waits exactly the backoff.
	NoJitter
)

// RetryPolicy bounds how calls are retried. The zero value of each field
// means its default.
type RetryPolicy struct {
	// MaxAttempts bounds executions per call, first attempt included
	// (default 3; 1 disables retries).
	MaxAttempts int
	// InitialBackoff is the delay before the first retry (default 100ms).
	InitialBackoff time.Duration
	// MaxBackoff caps the delay (default 10s).
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
		return p, fmt.Errorf("dispatch: WithRetry: MaxAttempts %d must be at least 1", p.MaxAttempts)
	case p.InitialBackoff < 0, p.MaxBackoff < 0, p.AttemptTimeout < 0, p.BudgetWindow < 0:
		return p, errors.New("dispatch: WithRetry: durations must not be negative")
	case p.Multiplier < 0 || math.IsNaN(p.Multiplier) || (p.Multiplier > 0 && p.Multiplier < 1):
		return p, fmt.Errorf("dispatch: WithRetry: Multiplier %v must be at least 1", p.Multiplier)
	case p.Jitter > NoJitter:
		return p, fmt.Errorf("dispatch: WithRetry: unknown Jitter %d", p.Jitter)
	case p.BudgetRatio < 0 || math.IsNaN(p.BudgetRatio):
		return p, fmt.Errorf("dispatch: WithRetry: BudgetRatio %v must not be negative", p.BudgetRatio)
	case p.BudgetMin < 0:
		return p, fmt.Errorf("dispatch: WithRetry: BudgetMin %d must not be negative", p.BudgetMin)
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

// backoff returns the delay before retry number n (n ≥ 1: the delay after
// the n-th failed attempt), jittered.
func (p *RetryPolicy) backoff(n int) time.Duration {
	b := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(n-1))
	if b > float64(p.MaxBackoff) || math.IsInf(b, 0) || math.IsNaN(b) {
		b = float64(p.MaxBackoff)
	}
	d := time.Duration(b)
	switch p.Jitter {
	case FullJitter:
		return time.Duration(rand.Int64N(int64(d) + 1))
	case EqualJitter:
		half := d / 2
		return half + time.Duration(rand.Int64N(int64(d-half)+1))
	}
	return d
}

// RetryError is the error of a call that failed for good. It unwraps to the
// last execution's error, and matches ErrExpired when the call's deadline
// stopped the retries and ErrCircuitOpen when the breaker did.
type RetryError struct {
	// Attempts is the number of executions made.
	Attempts int
	// Last is the last execution's error (or the before-retry hook's).
	Last error
	// Reason says why the call was not retried (further): "permanent",
	// "attempts", "deadline", "budget", "recompute" (no before-retry hook
	// to rebuild a call that needs it) or "before-retry" (the hook failed).
	Reason string
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("dispatch: failed after %d attempt(s) (%s): %v", e.Attempts, e.Reason, e.Last)
}

// Unwrap returns the last error.
func (e *RetryError) Unwrap() error { return e.Last }

// Is matches ErrExpired for Reason "deadline".
func (e *RetryError) Is(target error) bool {
	return target == ErrExpired && e.Reason == "deadline"
}

// WithClassifier sets how execution errors are judged (default
// DefaultClassifier). It runs in the worker, outside every lock. An error
// from a call whose own context was cancelled (its waiters left, it was
// superseded, the dispatcher closed) is never classified or retried.
func WithClassifier(classify func(error) Class) Option {
	return optionFunc(func(c *config) error {
		if classify == nil {
			return errors.New("dispatch: WithClassifier: nil function")
		}
		c.classify = classify
		return nil
	})
}

// WithRetry sets the retry policy (see RetryPolicy for the defaults that
// apply without it).
func WithRetry(p RetryPolicy) Option {
	return optionFunc(func(c *config) error {
		p, err := p.withDefaults()
		if err != nil {
			return err
		}
		c.retry = p
		return nil
	})
}

// WithBeforeRetry sets a hook that runs in the worker before every retry
// and before re-running a Recompute failure, outside every lock, with the
// call's context. It checks the earlier outcome so that no effect happens
// twice:
//
//   - done = true: the earlier attempt took effect after all (the object
//     exists, the pod is bound). The call ends Succeeded without another
//     execution; Stats.AlreadyDone counts it.
//   - otherwise next is the call to run: the same one, or one rebuilt from
//     fresh state (the Recompute path). It is what Result.Call reports.
//   - err != nil: the call ends Failed with a RetryError of Reason
//     "before-retry".
//
// K and T must be the Dispatcher's, or New fails.
func WithBeforeRetry[K comparable, T any](hook func(ctx context.Context, key K, call T, lastErr error) (next T, done bool, err error)) Option {
	return optionFunc(func(c *config) error {
		if hook == nil {
			return errors.New("dispatch: WithBeforeRetry: nil function")
		}
		c.beforeRetry = hook
		return nil
	})
}

type idemKey struct{}

// IdempotencyKey returns the SubmitOptions.IdempotencyKey of the call that
// ctx (an exec context) runs, unchanged on every attempt, so that exec can
// pass it to a server that deduplicates by it.
func IdempotencyKey(ctx context.Context) string {
	s, _ := ctx.Value(idemKey{}).(string)
	return s
}

// window counts events in a sliding window of fixed buckets, so that the
// retry budget and the breaker need no allocation or timer per event.
type window struct {
	width   int64 // ns per bucket
	buckets [windowBuckets]bucket
}

const windowBuckets = 10

type bucket struct {
	start    int64
	first    uint64 // first attempts
	retries  uint64
	failures uint64 // retryable failures
	total    uint64 // counted outcomes (breaker)
}

func newWindow(span time.Duration) window {
	return window{width: max(int64(span)/windowBuckets, 1)}
}

// at returns the bucket for now, clearing it if it is from an older round.
func (w *window) at(now int64) *bucket {
	start := now - now%w.width
	b := &w.buckets[(now/w.width)%windowBuckets]
	if b.start != start {
		*b = bucket{start: start}
	}
	return b
}

// sum totals the buckets still inside the window.
func (w *window) sum(now int64) bucket {
	var s bucket
	oldest := now - now%w.width - (windowBuckets-1)*w.width
	for i := range w.buckets {
		b := &w.buckets[i]
		if b.start >= oldest && b.start <= now {
			s.first += b.first
			s.retries += b.retries
			s.failures += b.failures
			s.total += b.total
		}
	}
	return s
}

// budgetAllows reports whether one more retry fits the retry budget, and
// if so charges it.
func (d *Dispatcher[K, T]) budgetAllows(now int64) bool {
	p := &d.retry
	if math.IsInf(p.BudgetRatio, 1) {
		return true
	}
	s := d.budget.sum(now)
	if s.retries >= uint64(p.BudgetMin) && float64(s.retries+1) > p.BudgetRatio*float64(s.first) {
		return false
	}
	d.budget.at(now).retries++
	return true
}
