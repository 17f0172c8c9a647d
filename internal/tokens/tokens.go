// Package tokens hands out a rate limiter's tokens to a dispatcher's
// workers without any of them sleeping. A token is taken before a call is
// chosen and held by the dispatcher, not by a call, until a worker spends
// it, so that the call that runs is the best one at the moment the token
// is granted.
//
// It knows three shapes of limiter: one that takes reservations
// (*rate.Limiter), which is asked for one and handed out when it is due;
// one that can be tried (TryAccept and QPS, client-go's
// flowcontrol.RateLimiter), tried again once per token interval; and any
// other, which only a goroutine of the owner can wait on (Fetched hands
// each token it gets over), unless its Allow, if it has one, grants the
// token at once. Whatever the limiter answers, no answer is
// committed to for longer than MaxWait, so a limiter changed at run time
// takes effect within it and nothing spins.
//
// Tokens is not safe for concurrent use: its owner guards it with its
// lock. The limiter itself is called under that lock, except Wait; a
// method of it that panics there, or exits the goroutine, is told to the
// owner (Fault) and counts as a limiter that grants nothing for now.
package tokens

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/coalescer/dispatch/internal/sat"
	"golang.org/x/time/rate"
)

// Limiter is any rate limiter: one that can at least be waited on.
type Limiter interface {
	Wait(ctx context.Context) error
}

// reserver and tryer are the shapes of limiter a token can be taken from
// without blocking.
type (
	reserver interface {
		ReserveN(t time.Time, n int) *rate.Reservation
	}
	tryer interface {
		TryAccept() bool
		QPS() float32
	}
	// allower is a limiter otherwise only waited on that can say, without
	// blocking, that a token is granted now; Allow takes it.
	allower interface {
		Allow() bool
	}
)

// MaxWait bounds how long an answer of the limiter is committed to: a
// reservation due later than this is cancelled and asked again then, and a
// limiter that grants nothing now (paused, slowed to almost nothing, or
// failing) is asked again within it. So a limiter changed at run time
// (SetLimit, SetBurst) takes effect within a second, and no limiter makes
// the owner spin or wait forever on a stale answer.
const MaxWait = int64(time.Second)

// WhenFetched is the time Ready gives when only the fetching goroutine
// can bring the next token.
const WhenFetched = math.MaxInt64

// Tokens is the tokens of one limiter. Its zero value has no limiter:
// every token is ready.
type Tokens struct {
	l     Limiter // nil: no limit
	res   reserver
	try   tryer
	allow allower           // a waited-on limiter's non-blocking try; nil: none
	epoch time.Time         // the owner's clock origin: Ready's times are ns since it
	held  int               // granted and not yet spent
	r     *rate.Reservation // outstanding reservation, due at at
	at    int64             // when r is due, or when to try again; 0: now
	fetch bool              // the fetching goroutine should wait for one
	fails int               // the fetching goroutine's failed Waits in a row
}

// Fault is told that a method of the limiter that Ready called, under its
// caller's lock, ended abnormally: it panicked with v, or (v nil) exited
// the goroutine (runtime.Goexit). The limiter then grants nothing for now
// and is asked again within MaxWait, so that one that keeps failing
// cannot make the owner spin. On an exit, the goroutine ends when Fault
// returns: Fault must finish the caller's work, and release its lock.
type Fault func(v any)

// New returns the tokens of l (nil: no limit), on a clock of ns since
// epoch.
func New(l Limiter, epoch time.Time) Tokens {
	t := Tokens{l: l, epoch: epoch}
	t.res, _ = l.(reserver)
	t.try, _ = l.(tryer)
	if t.res == nil && t.try == nil {
		t.allow, _ = l.(allower)
	}
	return t
}

// NeedsFetcher reports whether the limiter can only be waited on, by a
// goroutine of the owner's.
func (t *Tokens) NeedsFetcher() bool { return t.l != nil && t.res == nil && t.try == nil }

// Ready reports whether a token is available at now, taking one from the
// limiter if it can without blocking. If not, it returns when to look
// again (WhenFetched: when the fetching goroutine delivers one), never more
// than MaxWait ahead. fault is told if the limiter panics or exits the
// goroutine.
func (t *Tokens) Ready(now int64, fault Fault) (bool, int64) {
	switch {
	case t.l == nil || t.held > 0:
		return true, 0
	case t.res == nil && t.try == nil && t.allow == nil:
		t.fetch = true
		return false, WhenFetched
	}
	return t.ask(now, fault)
}

// ask is Ready for a limiter it can ask without blocking: it asks, and
// contains what the limiter's methods, user code, do.
func (t *Tokens) ask(now int64, fault Fault) (ok bool, at int64) {
	returned := false
	defer func() {
		if !returned {
			ok, at = t.faulted(now, recover(), fault)
		}
	}()
	ok, at = t.asked(now)
	returned = true
	return ok, at
}

// faulted records that the limiter, asked at now, panicked with v or
// (v nil) exited the goroutine: it grants nothing until MaxWait has
// passed, but a token the fetching goroutine brings. It tells fault, last
// (on an exit, fault releases the lock), and returns what Ready returns.
func (t *Tokens) faulted(now int64, v any, fault Fault) (ok bool, at int64) {
	t.at, at = now+MaxWait, now+MaxWait
	if t.allow != nil {
		t.fetch, at = true, WhenFetched
	}
	fault(v)
	return false, at
}

// asked is what ask asks.
func (t *Tokens) asked(now int64) (bool, int64) {
	switch {
	case t.res != nil:
		return t.readyReserved(now)
	case t.try != nil:
		if now >= t.at {
			if t.try.TryAccept() {
				t.held++
				return true, 0
			}
			// Try again a token interval later, within [100µs, MaxWait]
			// however huge QPS is; a QPS that is no rate (0, NaN,
			// negative) is a pause: MaxWait.
			every := MaxWait
			if qps := float64(t.try.QPS()); qps > 0 {
				every = min(max(int64(sat.Duration(float64(time.Second)/qps)), int64(100*time.Microsecond)), MaxWait)
			}
			t.at = now + every
		}
		return false, t.at
	}
	if now >= t.at && t.allow.Allow() {
		t.held++
		return true, 0
	}
	t.fetch = true
	return false, WhenFetched
}

// readyReserved is Ready for a limiter that takes reservations: it
// reserves a token no more than MaxWait ahead, and hands it out when it is
// due.
func (t *Tokens) readyReserved(now int64) (bool, int64) {
	if t.r == nil {
		if now < t.at {
			return false, t.at // paused: not yet time to ask again
		}
		if t.paused() {
			t.at = now + MaxWait
			return false, t.at
		}
		wall := t.epoch.Add(time.Duration(now))
		r := t.res.ReserveN(wall, 1)
		delay := int64(r.DelayFrom(wall)) // InfDuration if !r.OK()
		if !r.OK() || delay > MaxWait {
			r.CancelAt(wall)
			t.at = now + MaxWait
			return false, t.at
		}
		t.r, t.at = r, now+delay
	}
	if now >= t.at {
		t.r, t.held = nil, t.held+1
		return true, 0
	}
	return false, t.at
}

// paused reports whether a limiter that reports its limit (*rate.Limiter)
// has one that is not a rate — NaN or negative, set at run time — which
// counts as a pause: no token until it is a rate again.
func (t *Tokens) paused() bool {
	l, ok := t.l.(interface{ Limit() rate.Limit })
	if !ok {
		return false
	}
	lim := float64(l.Limit())
	return math.IsNaN(lim) || lim < 0
}

// Spend uses a token that Ready reported.
func (t *Tokens) Spend() {
	if t.l != nil {
		t.held--
	}
}

// Take spends, at now, a token the owner already has — one held, or one
// reserved and due — without asking the limiter, and reports whether
// there was one. An execution that waits for its own token elsewhere (a
// caller waiting on the limiter itself) takes one of these first, so that
// a token granted is spent even when no worker comes for it.
func (t *Tokens) Take(now int64) bool {
	if t.r != nil && now >= t.at {
		t.r, t.held = nil, t.held+1
	}
	if t.l == nil || t.held == 0 {
		return false
	}
	t.held--
	return true
}

// Release gives back, at now, the token reserved and not yet due, if
// any, as its owner stops: a limiter shared with others (a client's
// bucket) grants it to them instead.
func (t *Tokens) Release(now int64) {
	if t.r != nil {
		t.r.CancelAt(t.epoch.Add(time.Duration(now)))
		t.r, t.at = nil, 0
	}
}

// Unspend gives back a token spent for an execution that did not happen:
// it is held again, for the next one.
func (t *Tokens) Unspend() {
	if t.l != nil {
		t.held++
	}
}

// WantFetch reports whether the fetching goroutine should wait for a
// token: a worker asked for one, and fewer than ahead are held (at least
// one). ahead is how many the owner could start at once: the ready calls
// it has free workers for. So the goroutine goes on fetching while those
// workers have calls to start, without a worker asking, and sleeping,
// between one token and the next; it holds no more tokens than there were
// free workers. Once enough are held, the ask is answered.
func (t *Tokens) WantFetch(ahead int) bool {
	if t.fetch && t.held >= max(ahead, 1) {
		t.fetch = false
	}
	return t.fetch
}

// Fetched hands over a token the fetching goroutine got.
func (t *Tokens) Fetched() { t.held, t.fails = t.held+1, 0 }

// Failed records that a Wait of the fetching goroutine failed (returned
// an error, panicked, or exited the goroutine, which a new one then
// replaces), and returns how long to pause before the next:
// FailureBackoff of the failures in a row.
func (t *Tokens) Failed() time.Duration {
	t.fails++
	return FailureBackoff(t.fails)
}

// Held returns how many tokens are granted and not yet spent.
func (t *Tokens) Held() int { return t.held }

// Limiter returns the limiter, for the fetching goroutine to wait on.
func (t *Tokens) Limiter() Limiter { return t.l }

// Check rejects a limiter that is not a rate (a NaN or negative limit or
// QPS) or can grant no token at all (a *rate.Limiter of burst 0 and a
// finite limit). A limiter that grants its burst and then stops (a limit
// of 0), or that is paused later, is not an error: executions wait until
// it grants again. QPS is the limiter's own code: one that panics is an
// error too.
func Check(l Limiter) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("QPS panicked: %v", v)
		}
	}()
	switch l := l.(type) {
	case *rate.Limiter:
		switch lim := float64(l.Limit()); {
		case math.IsNaN(lim) || lim < 0:
			return fmt.Errorf("rate %v is not a rate", lim)
		case l.Limit() != rate.Inf && l.Burst() <= 0:
			return fmt.Errorf("rate %v burst %d can never grant a token", lim, l.Burst())
		}
	case tryer:
		if q := float64(l.QPS()); math.IsNaN(q) || q < 0 {
			return fmt.Errorf("QPS %v is not a rate", q)
		}
	}
	return nil
}

// IsNil reports whether l is nil, or a nil pointer in an interface: the
// common `var l *rate.Limiter; if qps > 0 { l = … }` means no limit.
func IsNil(l Limiter) bool {
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

// Wait waits for a token under ctx, for an execution that runs inline, by
// wait: the limiter's Wait, as its owner calls it. A Wait that fails while
// ctx lives (a limiter of burst 0, say) is tried again after a back-off,
// as the fetching goroutine does; only the end of ctx ends the wait with
// an error.
func Wait(ctx context.Context, wait func(context.Context) error) error {
	for failures := 1; ; failures++ {
		err := wait(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		Pause(ctx, FailureBackoff(failures))
	}
}

// FailureBackoff is the pause after the n-th failed Wait in a row: from
// 10ms, doubling, to MaxWait, so that a limiter that refuses at once
// cannot make its waiter spin.
func FailureBackoff(n int) time.Duration {
	return time.Duration(min(int64(10*time.Millisecond)<<min(n-1, 10), MaxWait))
}

// Pause sleeps for d, or until ctx ends.
func Pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
