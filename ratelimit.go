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
// status patches wait for tokens runs on the next token; a call that then
// does not execute (Config.NoOp skips it) leaves its token to the next
// call. No worker sleeps while it waits: a *rate.Limiter (anything with
// ReserveN) is asked for a reservation, and the dispatcher's clock wakes a
// worker when it is due; anything with TryAccept() bool and QPS() float32
// is tried again by the clock once per token interval; any other limiter is
// waited on by one goroutine of the dispatcher, which hands each token to
// the best ready call — unless it also has Allow() bool, which a worker
// tries first: a limiter that can say without blocking that a token is
// granted now (and takes it) spares each such execution the hand-off from
// that goroutine. That goroutine fetches ahead while ready calls have free
// workers, so up to one token per free worker can be taken before the calls
// that spend them start (and, with Allow, left over when the workers took
// their own meanwhile); such a token is held, never dropped, and the next
// calls spend it, in either mode. A Sync-mode call spends such a token if
// the dispatcher holds one (or a reservation that is due), and otherwise
// waits for its own in its caller, under the call's own context; until it
// comes, the call counts as waiting to start (Stats.Ready), and its
// attempt has not begun (Observer.OnStart).
//
// No call runs without a token. A limiter that grants nothing for now —
// paused (SetLimit(0), SetBurst(0), a NaN or negative limit), slowed to
// almost nothing, or whose Wait fails — holds every execution until it
// grants again; the dispatcher asks again at least once a second, so a
// change takes effect within a second and nothing spins. A Wait under
// way is not asked again, though: a limiter waited on — by the
// dispatcher's goroutine (one with neither ReserveN nor TryAccept), or by
// a Sync-mode caller (any limiter) — takes a change once its Wait
// returns. A *rate.Limiter's Wait sleeps until the token it reserved at
// the old rate, for ever after SetLimit(0): in Async mode give the
// dispatcher the *rate.Limiter itself, not a wrapper that hides its
// ReserveN; in Sync mode give calls a deadline (a Wait that would pass it
// fails at once, and is tried again after a back-off).
//
// The limiter is user code (package documentation, "Callbacks"). A Wait
// that panics has failed, and is tried again after a back-off; one that
// exits its goroutine (runtime.Goexit) has granted nothing: the fetching
// goroutine is replaced, and a Sync-mode call goes back to the queue,
// where a worker takes a token for it. Allow, TryAccept, QPS and ReserveN
// are called under the dispatcher's lock, so they must not block or call
// the Dispatcher; one that panics or exits its goroutine grants nothing
// for a second (an Allow-shaped limiter's Wait may still). Each of these
// is counted in Stats.CallbackPanics.
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
// (tokens.Tokens.Failed), so that a limiter that refuses at once cannot
// make it spin; so is one that panics, and one that exits the goroutine,
// by the goroutine that takes its place (spawn). It takes the lock itself,
// and holds it except while it waits: nothing of it is held when the
// limiter ends the goroutine.
func (d *Dispatcher[K, T]) fetcher() {
	l := d.gate.tokens.Limiter()
	d.mu.Lock()
	for !d.stopped {
		if !d.gate.tokens.WantFetch(min(d.q.nready, d.gate.limit()-d.gate.running)) {
			d.fetchCond.Wait()
			continue
		}
		d.mu.Unlock()
		err := d.tell.waitToken(d.base, l, d.fetchFailed)
		d.mu.Lock()
		switch {
		case err == nil:
			d.gate.tokens.Fetched()
			d.wake.worker()
		case d.base.Err() == nil:
			pause := d.gate.tokens.Failed()
			d.mu.Unlock()
			tokens.Pause(d.base, pause)
			d.mu.Lock()
		}
		// else closing: base is cancelled, and stopped is about to be set
	}
	d.mu.Unlock()
}

// fetchFailed backs off, before the fetcher's goroutine ends, when the
// limiter's Wait ended it: the goroutine that takes its place waits
// again after the back-off a failed Wait gets. It takes the lock itself.
func (d *Dispatcher[K, T]) fetchFailed() {
	d.mu.Lock()
	pause := d.gate.tokens.Failed()
	d.mu.Unlock()
	tokens.Pause(d.base, pause)
}

// waitToken waits once on l under ctx, without the lock. l is user code:
// a panic in its Wait is a failed Wait, counted as a callback's
// (Stats.CallbackPanics); if Wait ends the goroutine, that is counted too,
// and onExit runs on the way out.
func (tl *teller[K, T]) waitToken(ctx context.Context, l RateLimiter, onExit func()) error {
	pe, err := guard(callbackRateLimit, func() error { return l.Wait(ctx) }, func(pe *PanicError) {
		tl.contain(pe)
		onExit()
	})
	tl.contain(pe)
	return err
}
