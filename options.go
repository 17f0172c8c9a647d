package dispatch

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"
)

// Defaults for the options. They suit a scheduler's API dispatcher; tune them
// to the API server's capacity.
const (
	// DefaultWorkers is the number of workers when WithWorkers is not given.
	DefaultWorkers = 16
	// DefaultCapacity is the bound on tracked keys when WithCapacity is not
	// given.
	DefaultCapacity = 10000
	// DefaultWaitersPerKey is the multiple of capacity that bounds live
	// tickets when WithMaxWaiters is not given.
	DefaultWaitersPerKey = 4
	// DefaultAging is the aging interval when WithAging is not given: a
	// waiting call gains one priority level per second.
	DefaultAging = time.Second
)

// An Option configures a Dispatcher. Options are checked by [New]: an
// invalid one makes New return an error naming it.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// config holds every setting, with defaults set in one place (defaultConfig).
// The generic callbacks are stored as any and checked against K and T in New.
type config struct {
	workers    int
	capacity   int
	maxWaiters int // 0: DefaultWaitersPerKey × capacity
	aging      time.Duration
	limiter    *rate.Limiter
	merge      any // func(T, T) (T, error)
	noop       any // func(K, T) bool
	onDone     any // func(Result[K, T])

	classify    func(error) Class
	retry       RetryPolicy
	beforeRetry any // func(context.Context, K, T, error) (T, bool, error)
	breaker     *BreakerPolicy

	tenants       map[string]TenantConfig
	defaultTenant TenantConfig

	observer Observer
	label    any // func(K, T) string
	mode     Mode
	fallback *FallbackPolicy
	switchTo SwitchPolicy
}

func defaultConfig() config {
	retry, _ := RetryPolicy{}.withDefaults()
	return config{
		workers:  DefaultWorkers,
		capacity: DefaultCapacity,
		aging:    DefaultAging,
		classify: DefaultClassifier,
		retry:    retry,
	}
}

// WithWorkers sets the number of workers that run calls: the bound on
// concurrent executions. n must be positive.
func WithWorkers(n int) Option {
	return optionFunc(func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("dispatch: WithWorkers(%d): must be positive", n)
		}
		c.workers = n
		return nil
	})
}

// WithCapacity bounds the number of tracked keys (keys with a call queued or
// in flight). A submission for a new key beyond it evicts the worst queued
// droppable call (SubmitOptions.Droppable; lowest effective priority, then
// newest) if the newcomer would run before it — that call's waiters end
// Dropped — and is otherwise refused with ErrBackpressure. A submission that
// coalesces into a tracked key needs no capacity. Non-droppable and in-flight
// calls are never shed. n must be positive.
func WithCapacity(n int) Option {
	return optionFunc(func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("dispatch: WithCapacity(%d): must be positive", n)
		}
		c.capacity = n
		return nil
	})
}

// WithMaxWaiters bounds the number of live tickets (Submit callers waiting
// for an outcome), so memory stays bounded even when many callers pile onto
// one key. Fire-and-forget submissions (Post) hold no ticket and are not
// counted. The default is DefaultWaitersPerKey × capacity. n must be
// positive.
func WithMaxWaiters(n int) Option {
	return optionFunc(func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("dispatch: WithMaxWaiters(%d): must be positive", n)
		}
		c.maxWaiters = n
		return nil
	})
}

// WithAging sets how fast waiting calls gain priority: one level per
// interval. A call of priority p that waits behind an endless stream of
// priority q > p runs within about (q-p+1) × interval.
//
// WithAging(0) gives strict priority (FIFO within a level). That is
// starvation-prone: under sustained high-priority load, low-priority calls
// may never run. interval must not be negative.
func WithAging(interval time.Duration) Option {
	return optionFunc(func(c *config) error {
		if interval < 0 {
			return fmt.Errorf("dispatch: WithAging(%v): must not be negative", interval)
		}
		c.aging = interval
		return nil
	})
}

// WithRateLimit bounds the rate of executions (API QPS). Each execution
// waits for one token, in its worker, under the call's context; a
// coalesced submission costs nothing. A nil limiter means no limit.
func WithRateLimit(l *rate.Limiter) Option {
	return optionFunc(func(c *config) error {
		c.limiter = l
		return nil
	})
}

// WithMerge sets how a submission is coalesced into the pending call for its
// key. merge gets the pending call and the incoming one and returns the call
// that will run: a combination of both, or either one unchanged (overwrite or
// skip). If it returns an error, the incoming submission is rejected with an
// error matching ErrMergeRejected and wrapping it, and the pending call is
// left as it was.
//
// Without WithMerge the incoming call replaces the pending one.
//
// merge runs under the dispatcher's lock, so that a merge and the start of
// the call it merges into cannot interleave: it must be fast, must not block
// and must not call the Dispatcher. A panic in merge rejects the submission.
// T must be the Dispatcher's call type, or New fails.
func WithMerge[T any](merge func(pending, incoming T) (T, error)) Option {
	return optionFunc(func(c *config) error {
		if merge == nil {
			return errors.New("dispatch: WithMerge: nil function")
		}
		c.merge = merge
		return nil
	})
}

// WithNoOp sets a test that finds calls that would change nothing. It runs
// in the worker just before each execution, outside every lock; when it
// returns true the call is not executed and ends Skipped, which counts as
// success. K and T must be the Dispatcher's, or New fails.
func WithNoOp[K comparable, T any](noop func(key K, call T) bool) Option {
	return optionFunc(func(c *config) error {
		if noop == nil {
			return errors.New("dispatch: WithNoOp: nil function")
		}
		c.noop = noop
		return nil
	})
}

// WithOnDone sets a completion hook that fires once per finished call — the
// "re-evaluate this object" event. It receives the call's result: its
// waiters' common state (or Stale for an execution that finished after its
// call lost every waiter), attempts and timings. It runs outside every lock,
// after the waiters have been told, on whichever goroutine ended the call: a
// worker, the dispatcher's timer goroutine, or a caller of Submit, Cancel or
// Close. It must not block for long. K and T must be the Dispatcher's, or New
// fails.
func WithOnDone[K comparable, T any](hook func(Result[K, T])) Option {
	return optionFunc(func(c *config) error {
		if hook == nil {
			return errors.New("dispatch: WithOnDone: nil function")
		}
		c.onDone = hook
		return nil
	})
}

// typed checks that a generic option's function has the Dispatcher's types.
func typed[F any](v any, name string) (F, error) {
	var zero F
	if v == nil {
		return zero, nil
	}
	f, ok := v.(F)
	if !ok {
		return zero, fmt.Errorf("dispatch: %s: function is %T, want %T", name, v, zero)
	}
	return f, nil
}
