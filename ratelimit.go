package dispatch

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"
)

// RateLimiter bounds the rate of executions (Config.RateLimit): each
// execution takes one token. *rate.Limiter from golang.org/x/time/rate
// satisfies it, and so does client-go's flowcontrol.RateLimiter.
//
// A worker takes its token before it chooses a call, so the call that runs
// is the best one at the moment the token is granted: a bind that arrives
// while status patches wait for tokens runs on the next token, not after
// every patch that already holds a worker. No worker sleeps while it waits:
//
//   - A *rate.Limiter (anything with ReserveN(time.Time, int)
//     *rate.Reservation) is asked for a reservation, and the dispatcher's
//     one timer fires when it is due.
//   - Anything with TryAccept() bool and QPS() float32 — client-go's
//     flowcontrol.RateLimiter — is tried again on the timer, once per token
//     interval.
//   - Any other limiter is waited on by one goroutine of the dispatcher,
//     which hands each token it gets to the best ready call.
//
// A call running inline (Sync mode) waits for its token in its caller,
// under the call's own context.
//
// With a Kubernetes client, let the dispatcher enforce the QPS and open up
// the clientset's own bucket (rest.Config QPS −1): a bucket behind the
// workers hands tokens out in the order workers happen to ask, so a bind
// waits behind every status patch that already holds a worker.
type RateLimiter interface {
	// Wait blocks until a token is available or ctx ends.
	Wait(ctx context.Context) error
}

// reserver and tryer are the shapes of limiter the dispatcher can take a
// token from without blocking.
type (
	reserver interface {
		ReserveN(t time.Time, n int) *rate.Reservation
	}
	tryer interface {
		TryAccept() bool
		QPS() float32
	}
)

// checkLimiter rejects a limiter that can never grant a token.
func checkLimiter(l RateLimiter) error {
	switch l := l.(type) {
	case *rate.Limiter:
		if l.Limit() != rate.Inf && (l.Limit() <= 0 || l.Burst() <= 0) {
			return fieldErr("RateLimit", fmt.Sprintf("rate %v burst %d", l.Limit(), l.Burst()), "can never grant a token")
		}
	case tryer:
		if l.QPS() <= 0 {
			return fieldErr("RateLimit", fmt.Sprintf("QPS %v", l.QPS()), "can never grant a token")
		}
	}
	return nil
}

// tokens hands out the rate limiter's tokens to workers, guarded by the
// Dispatcher's lock. A token is taken before a call is chosen and held by
// the dispatcher, not by a call, until a worker spends it.
type tokens struct {
	l     RateLimiter // nil: no limit
	res   reserver
	try   tryer
	held  int               // granted and not yet spent
	r     *rate.Reservation // outstanding reservation, due at at
	at    int64             // when r is due, or when to try again; 0: now
	fetch bool              // the fetching goroutine should wait for one
}

func newTokens(l RateLimiter) tokens {
	t := tokens{l: l}
	t.res, _ = l.(reserver)
	t.try, _ = l.(tryer)
	return t
}

// needsFetcher reports whether the limiter can only be waited on, by a
// goroutine of the dispatcher's.
func (t *tokens) needsFetcher() bool { return t.l != nil && t.res == nil && t.try == nil }

// ready reports whether a token is available now, taking one from the
// limiter if it can without blocking. If not, it returns when to look
// again (maxTime: when the fetching goroutine delivers one).
func (t *tokens) ready(now int64, wall func(int64) time.Time) (bool, int64) {
	switch {
	case t.l == nil || t.held > 0:
		return true, 0
	case t.res != nil:
		if t.r == nil {
			t.r = t.res.ReserveN(wall(now), 1)
			t.at = now + int64(t.r.DelayFrom(wall(now)))
		}
		if now >= t.at {
			t.r, t.held = nil, t.held+1
			return true, 0
		}
		return false, t.at
	case t.try != nil:
		if now >= t.at {
			if t.try.TryAccept() {
				t.held++
				return true, 0
			}
			t.at = now + int64(float64(time.Second)/float64(t.try.QPS()))
		}
		return false, t.at
	}
	t.fetch = true
	return false, maxTime
}

// spend uses a token that ready reported.
func (t *tokens) spend() {
	if t.l != nil {
		t.held--
	}
}

// fetcher waits on a limiter that can only be waited on, and hands each
// token to the workers. It takes the lock itself.
func (d *Dispatcher[K, T]) fetcher() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for !d.stopped {
		if !d.tokens.fetch || d.tokens.held > 0 {
			d.fetchCond.Wait()
			continue
		}
		d.mu.Unlock()
		err := d.tokens.l.Wait(d.base)
		d.mu.Lock()
		if err != nil {
			continue // closing: base is cancelled
		}
		d.tokens.held++
		d.tokens.fetch = false
		d.wakeWorker()
	}
}
