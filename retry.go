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
	// (Config.BeforeRetry) before it runs again. Without that hook it ends
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

// GiveUp says why a failed call was not retried (further). Its values are
// a fixed set, safe as a metric label.
type GiveUp string

// The reasons a call is not retried.
const (
	// GiveUpPermanent: the classifier judged the error Permanent.
	GiveUpPermanent GiveUp = "permanent"
	// GiveUpAttempts: Retry.MaxAttempts executions were made.
	GiveUpAttempts GiveUp = "attempts"
	// GiveUpDeadline: the next attempt could not start before the call's
	// deadline.
	GiveUpDeadline GiveUp = "deadline"
	// GiveUpBudget: the retry budget (Retry.BudgetRatio) was spent.
	GiveUpBudget GiveUp = "budget"
	// GiveUpRecompute: the error needs the call rebuilt (Recompute) and no
	// BeforeRetry hook is configured to rebuild it.
	GiveUpRecompute GiveUp = "recompute"
	// GiveUpBeforeRetry: the BeforeRetry hook returned an error.
	GiveUpBeforeRetry GiveUp = "before-retry"
)

// RetryError is the error of a call that failed for good after it was
// judged. It unwraps to the last execution's error, and matches ErrExpired
// when the call's deadline stopped the retries.
type RetryError struct {
	// Attempts is the number of executions made.
	Attempts int
	// Last is the last execution's error (or the before-retry hook's).
	Last error
	// Reason says why the call was not retried (further).
	Reason GiveUp
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("dispatch: failed after %d attempt(s) (%s): %v", e.Attempts, e.Reason, e.Last)
}

// Unwrap returns the last error.
func (e *RetryError) Unwrap() error { return e.Last }

// Is matches ErrExpired for Reason GiveUpDeadline.
func (e *RetryError) Is(target error) bool {
	return target == ErrExpired && e.Reason == GiveUpDeadline
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
	p := &d.cfg.Retry
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
