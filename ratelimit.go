package dispatch

import (
	"context"

	"github.com/coalescer/dispatch/internal/tokens"
)

// RateLimiter bounds the rate of executions (Config.RateLimit): each
// execution takes one token. *rate.Limiter from golang.org/x/time/rate
// satisfies it, and so does client-go's flowcontrol.RateLimiter.
//
// A worker takes its token before it chooses a call, so the call that runs
// is the best one when the token is granted: a bind that arrives while
// status patches wait for tokens runs on the next token. No worker sleeps
// while it waits: a *rate.Limiter (anything with ReserveN) is asked for a
// reservation, and the dispatcher's clock wakes a worker when it is due;
// anything with TryAccept() bool and QPS() float32 is tried again by the
// clock once per token interval; any other limiter is waited on by one
// goroutine of the dispatcher, which hands each token to the best ready
// call — unless it also has Allow() bool, which a worker tries first: a
// limiter that can say without blocking that a token is granted now (and
// takes it) spares each such execution the hand-off from that goroutine.
// That goroutine fetches ahead while ready calls have free workers, so
// up to one token per free worker can be taken before the calls that
// spend them start (and, with Allow, left over when the workers took
// their own meanwhile); such a token is held, never dropped, and the
// next calls spend it. A Sync-mode call waits for its token in its
// caller, under the call's own context.
//
// No call runs without a token. A limiter that grants nothing for now —
// paused (SetLimit(0), SetBurst(0), a NaN or negative limit), slowed to
// almost nothing, or whose Wait fails — holds every execution until it
// grants again; the dispatcher asks again at least once a second, so a
// change takes effect within a second and nothing spins.
//
// With a Kubernetes client, let the dispatcher enforce the QPS and open up
// the clientset's bucket (rest.Config QPS −1): a bucket behind the workers
// makes a bind wait behind every status patch holding a worker.
type RateLimiter interface {
	// Wait blocks until a token is available or ctx ends.
	Wait(ctx context.Context) error
}

// fetcher waits on a limiter that can only be waited on, and hands each
// token to the workers. Asked by a worker that found none, it fetches
// tokens until the free workers have one for each ready call, waking a
// worker with each, so that a worker that ends its call finds the next
// token held rather than asking and sleeping until it comes. A token
// fetched for a call that cannot start yet (its tenant at its cap, the
// free workers reserved for urgent calls) stays held for the next call
// that can: at most as many as the workers free when it was fetched. A
// Wait that fails (other than by Close) is tried again after a back-off
// (tokens.FailureBackoff), so that a limiter that refuses at once cannot
// make it spin. It takes the lock itself.
func (d *Dispatcher[K, T]) fetcher() {
	failures := 0
	d.mu.Lock()
	defer d.mu.Unlock()
	for !d.stopped {
		if !d.gate.tokens.WantFetch(min(d.q.nready, d.gate.limit()-d.gate.running)) {
			d.fetchCond.Wait()
			continue
		}
		d.mu.Unlock()
		err := d.gate.tokens.Limiter().Wait(d.base)
		if err != nil && d.base.Err() == nil {
			failures++
			tokens.Pause(d.base, tokens.FailureBackoff(failures))
		}
		d.mu.Lock()
		if err != nil {
			continue // closing (base is cancelled), or after the back-off
		}
		failures = 0
		d.gate.tokens.Fetched()
		d.wake.worker()
	}
}
