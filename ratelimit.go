package dispatch

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
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
// No call runs without a token. A limiter that grants nothing for now —
// paused at run time (SetLimit(0), SetBurst(0), a NaN or negative limit,
// which counts as a pause), slowed to almost nothing, or whose Wait fails —
// holds every execution until it grants again; the dispatcher asks it again
// at least once a second (a failing Wait after a back-off), so a change
// takes effect within a second and nothing spins.
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

// checkLimiter rejects a limiter that is not a rate (a NaN or negative
// limit or QPS) or can grant no token at all (a *rate.Limiter of burst 0
// and a finite limit). A limiter that grants its burst and then stops (a
// limit of 0), or that is paused later, is not an error: executions wait
// until it grants again (see RateLimiter).
func checkLimiter(l RateLimiter) error {
	switch l := l.(type) {
	case *rate.Limiter:
		switch lim := float64(l.Limit()); {
		case math.IsNaN(lim) || lim < 0:
			return fieldErr("RateLimit", fmt.Sprintf("rate %v", lim), "is not a rate")
		case l.Limit() != rate.Inf && l.Burst() <= 0:
			return fieldErr("RateLimit", fmt.Sprintf("rate %v burst %d", lim, l.Burst()), "can never grant a token")
		}
	case tryer:
		if q := float64(l.QPS()); math.IsNaN(q) || q < 0 {
			return fieldErr("RateLimit", fmt.Sprintf("QPS %v", q), "is not a rate")
		}
	}
	return nil
}

// isNil reports whether l is nil, or a nil pointer in an interface: the
// common `var l *rate.Limiter; if qps > 0 { l = … }` means no limit.
func isNil(l RateLimiter) bool {
	if l == nil {
		return true
	}
	v := reflect.ValueOf(l)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Interface, reflect.Slice:
		return v.IsNil()
	}
	return false
}

// maxTokenWait bounds how long the dispatcher commits to a limiter's
// answer: a reservation due later than this is cancelled and asked again
// then, and a limiter that grants nothing now (paused, slowed to almost
// nothing, or failing) is asked again within it. So a limiter changed at
// run time (SetLimit, SetBurst) takes effect within a second, and no
// limiter makes the dispatcher spin or wait forever on a stale answer.
const maxTokenWait = int64(time.Second)

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
// again (maxTime: when the fetching goroutine delivers one), never more
// than maxTokenWait ahead.
func (t *tokens) ready(now int64, wall func(int64) time.Time) (bool, int64) {
	switch {
	case t.l == nil || t.held > 0:
		return true, 0
	case t.res != nil:
		if t.r == nil {
			if now < t.at {
				return false, t.at // paused: not yet time to ask again
			}
			if t.paused() {
				t.at = now + maxTokenWait
				return false, t.at
			}
			r := t.res.ReserveN(wall(now), 1)
			delay := int64(r.DelayFrom(wall(now))) // InfDuration if !r.OK()
			if !r.OK() || delay > maxTokenWait {
				r.CancelAt(wall(now))
				t.at = now + maxTokenWait
				return false, t.at
			}
			t.r, t.at = r, now+delay
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
			// Try again a token interval later, within [100µs, maxTokenWait]
			// whatever QPS says (0, NaN, huge).
			every := int64(sat.Duration(float64(time.Second) / float64(t.try.QPS())))
			t.at = now + min(max(every, int64(100*time.Microsecond)), maxTokenWait)
		}
		return false, t.at
	}
	t.fetch = true
	return false, maxTime
}

// paused reports whether a limiter that reports its limit (*rate.Limiter)
// has one that is not a rate — NaN or negative, set at run time — which
// this dispatcher treats as a pause: no token until it is a rate again.
func (t *tokens) paused() bool {
	l, ok := t.l.(interface{ Limit() rate.Limit })
	if !ok {
		return false
	}
	lim := float64(l.Limit())
	return math.IsNaN(lim) || lim < 0
}

// spend uses a token that ready reported.
func (t *tokens) spend() {
	if t.l != nil {
		t.held--
	}
}

// fetcher waits on a limiter that can only be waited on, and hands each
// token to the workers. A Wait that fails (other than by Close) is tried
// again after a back-off, from 10ms doubling to maxTokenWait, so that a
// limiter that refuses at once cannot make it spin. It takes the lock
// itself.
func (d *Dispatcher[K, T]) fetcher() {
	failures := 0
	d.mu.Lock()
	defer d.mu.Unlock()
	for !d.stopped {
		if !d.tokens.fetch || d.tokens.held > 0 {
			d.fetchCond.Wait()
			continue
		}
		d.mu.Unlock()
		err := d.tokens.l.Wait(d.base)
		if err != nil && d.base.Err() == nil {
			failures++
			pause(d.base, failureBackoff(failures))
		}
		d.mu.Lock()
		if err != nil {
			continue // closing (base is cancelled), or after the back-off
		}
		failures = 0
		d.tokens.held++
		d.tokens.fetch = false
		d.wakeWorker()
	}
}

// waitToken waits for a token for an inline (Sync-mode) execution, under
// ctx, the call's own context. A Wait that fails while ctx lives (a
// limiter of burst 0, say) is tried again after a back-off, as the
// fetcher does; only the end of ctx ends the wait with an error.
func waitToken(ctx context.Context, l RateLimiter) error {
	for failures := 1; ; failures++ {
		err := l.Wait(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		pause(ctx, failureBackoff(failures))
	}
}

// failureBackoff is the pause after the n-th failed Wait in a row.
func failureBackoff(n int) time.Duration {
	return time.Duration(min(int64(10*time.Millisecond)<<min(n-1, 10), maxTokenWait))
}

// pause sleeps for d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
