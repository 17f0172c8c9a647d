package tokens

import (
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

var epoch = time.Unix(1000, 0)

const sec = int64(time.Second)

func TestNoLimiter(t *testing.T) {
	var tk Tokens
	ok, _ := tk.Ready(1, nil)
	assert.True(t, ok)
	tk.Spend()
	assert.False(t, tk.NeedsFetcher())
	assert.True(t, IsNil(nil))
	var l *rate.Limiter
	assert.True(t, IsNil(l), "a nil *rate.Limiter is no limit")
	assert.False(t, IsNil(rate.NewLimiter(1, 1)))
}

func TestReserved(t *testing.T) {
	tk := New(rate.NewLimiter(2, 1), epoch)
	ok, _ := tk.Ready(sec, nil)
	require.True(t, ok, "the burst")
	tk.Spend()
	ok, at := tk.Ready(sec, nil)
	assert.False(t, ok)
	assert.Equal(t, sec+sec/2, at, "the next token at 2/s")
	ok, _ = tk.Ready(at, nil)
	assert.True(t, ok, "due: handed out")
	ok, _ = tk.Ready(at, nil)
	assert.True(t, ok, "held until spent")
	tk.Spend()

	slow := New(rate.NewLimiter(rate.Every(time.Minute), 1), epoch)
	slow.Ready(sec, nil)
	slow.Spend()
	ok, at = slow.Ready(sec, nil)
	assert.False(t, ok)
	assert.Equal(t, sec+MaxWait, at, "a reservation beyond MaxWait is asked again then")

	paused := rate.NewLimiter(rate.Limit(math.NaN()), 1)
	p := New(paused, epoch)
	ok, at = p.Ready(sec, nil)
	assert.False(t, ok)
	assert.Equal(t, sec+MaxWait, at, "a NaN limit pauses")
}

type polled struct{ grant bool }

func (p *polled) Wait(context.Context) error { return nil }
func (p *polled) TryAccept() bool            { return p.grant }
func (p *polled) QPS() float32               { return 4 }

func TestPolled(t *testing.T) {
	l := &polled{}
	tk := New(l, epoch)
	ok, at := tk.Ready(sec, nil)
	assert.False(t, ok)
	assert.Equal(t, sec+sec/4, at, "tried again a token interval later")
	l.grant = true
	ok, _ = tk.Ready(sec+1, nil)
	assert.False(t, ok, "not before that time")
	ok, _ = tk.Ready(at, nil)
	assert.True(t, ok)
}

type waitOnly struct{ err error }

func (w waitOnly) Wait(context.Context) error { return w.err }

func TestFetched(t *testing.T) {
	tk := New(waitOnly{}, epoch)
	require.True(t, tk.NeedsFetcher())
	assert.False(t, tk.WantFetch(3), "nobody asked")
	ok, at := tk.Ready(sec, nil)
	assert.False(t, ok)
	assert.Equal(t, int64(WhenFetched), at)
	assert.True(t, tk.WantFetch(0), "asked: one at least")
	tk.Fetched()
	assert.False(t, tk.WantFetch(0), "one held")
	ok, _ = tk.Ready(sec, nil)
	assert.True(t, ok)
	tk.Spend()

	// Three free workers with calls to start: fetched until three are
	// held, then the ask is answered.
	_, _ = tk.Ready(sec, nil)
	for range 3 {
		assert.True(t, tk.WantFetch(3))
		tk.Fetched()
	}
	assert.False(t, tk.WantFetch(3))
	assert.False(t, tk.WantFetch(5), "answered: no more fetched until a worker asks again")
	for range 3 {
		ok, _ = tk.Ready(sec, nil)
		assert.True(t, ok)
		tk.Spend()
	}
	ok, _ = tk.Ready(sec, nil)
	assert.False(t, ok)
	assert.True(t, tk.WantFetch(1))
}

// allowing can be waited on and tried: Allow grants while open.
type allowing struct {
	open  bool
	tries int
}

func (a *allowing) Wait(context.Context) error { return nil }
func (a *allowing) Allow() bool                { a.tries++; return a.open }

// TestAllowed: a limiter that can only be waited on but offers Allow is
// tried first; while it grants, no goroutine fetches, and when it does not,
// the goroutine is asked as for any waited-on limiter. A *rate.Limiter,
// which has Allow too, stays a limiter that takes reservations.
func TestAllowed(t *testing.T) {
	l := &allowing{}
	tk := New(l, epoch)
	require.True(t, tk.NeedsFetcher(), "a goroutine still waits when Allow refuses")
	ok, at := tk.Ready(sec, nil)
	assert.False(t, ok)
	assert.Equal(t, int64(WhenFetched), at)
	assert.True(t, tk.WantFetch(1), "refused: the goroutine is asked")
	tk.Fetched()
	assert.False(t, tk.WantFetch(1), "one held: the ask is answered")
	ok, _ = tk.Ready(sec, nil)
	assert.True(t, ok, "the fetched token")
	assert.Equal(t, 1, l.tries, "a held token is spent before Allow is tried again")
	tk.Spend()

	l.open = true
	for range 3 {
		ok, _ = tk.Ready(sec, nil)
		require.True(t, ok)
		tk.Spend()
	}
	assert.Equal(t, 4, l.tries, "one try per token")
	assert.False(t, tk.WantFetch(4), "granted by Allow: nothing asked of the goroutine")

	r := New(rate.NewLimiter(1, 1), epoch)
	assert.Nil(t, r.allow, "a *rate.Limiter is reserved from, not tried")
	assert.False(t, r.NeedsFetcher())
}

func TestCheck(t *testing.T) {
	assert.NoError(t, Check(rate.NewLimiter(rate.Inf, 0)))
	assert.NoError(t, Check(rate.NewLimiter(0, 1)), "a burst, then nothing: not an error")
	assert.EqualError(t, Check(rate.NewLimiter(rate.Limit(-1), 1)), "rate -1 is not a rate")
	assert.EqualError(t, Check(rate.NewLimiter(1, 0)), "rate 1 burst 0 can never grant a token")
}

func TestWaitRetriesFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := Wait(ctx, waitOnly{errors.New("refused")}.Wait)
		assert.Error(t, err)
		assert.Equal(t, 100*time.Millisecond, time.Since(start), "retried until ctx ended")
		assert.Equal(t, 10*time.Millisecond, FailureBackoff(1))
		assert.Equal(t, time.Duration(MaxWait), FailureBackoff(100))
	})
}

// faulty is a limiter of each shape whose methods panic (or exit the
// goroutine) while bad.
type faulty struct {
	bad  func()
	asks int
}

func (f *faulty) ask() {
	f.asks++
	if f.bad != nil {
		f.bad()
	}
}
func (f *faulty) Wait(context.Context) error { return nil }

type (
	faultyTryer    struct{ *faulty }
	faultyAllower  struct{ *faulty }
	faultyReserver struct{ *faulty }
)

func (f faultyTryer) TryAccept() bool { f.ask(); return true }
func (f faultyTryer) QPS() float32    { return 1 }
func (f faultyAllower) Allow() bool   { f.ask(); return true }
func (f faultyReserver) ReserveN(t time.Time, n int) *rate.Reservation {
	f.ask()
	return rate.NewLimiter(rate.Inf, 0).ReserveN(t, n)
}

// TestLimiterFault pins that a limiter method Ready calls under its
// owner's lock, user code, that panics or exits the goroutine is told to
// the owner (Fault) and grants nothing for MaxWait — but a token the
// fetching goroutine brings, for a limiter that has one — rather than
// ending the owner or making it ask again at once.
func TestLimiterFault(t *testing.T) {
	for _, tc := range []struct {
		name    string
		shape   func(*faulty) Limiter
		fetched bool
	}{
		{"try", func(f *faulty) Limiter { return faultyTryer{f} }, false},
		{"allow", func(f *faulty) Limiter { return faultyAllower{f} }, true},
		{"reserve", func(f *faulty) Limiter { return faultyReserver{f} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &faulty{bad: func() { panic("broken") }}
			tk := New(tc.shape(f), epoch)
			var told []any
			fault := func(v any) { told = append(told, v) }
			ok, at := tk.Ready(sec, fault)
			assert.False(t, ok)
			assert.Equal(t, []any{"broken"}, told, "the panic is told")
			if tc.fetched {
				assert.Equal(t, int64(WhenFetched), at, "the fetching goroutine is asked")
				assert.True(t, tk.WantFetch(1))
			} else {
				assert.Equal(t, sec+MaxWait, at, "asked again within MaxWait")
			}
			f.bad = nil
			ok, _ = tk.Ready(sec+MaxWait-1, fault)
			assert.False(t, ok)
			assert.Equal(t, 1, f.asks, "not asked again before then")
			ok, _ = tk.Ready(sec+MaxWait, fault)
			assert.True(t, ok, "asked again, and granted")
			tk.Spend()

			// An exit: fault is told with nil, and the goroutine ends.
			f.bad = runtime.Goexit
			exited := make(chan []any)
			go func() {
				var told []any
				defer func() { exited <- told }()
				tk.Ready(3*sec, func(v any) { told = append(told, v) })
				t.Error("Ready returned to a goroutine the limiter exited")
			}()
			assert.Equal(t, []any{nil}, <-exited)
			f.bad = nil
			ok, _ = tk.Ready(3*sec+MaxWait-1, fault)
			assert.False(t, ok, "the exit, too, holds tokens for MaxWait")
		})
	}
}

// TestFailedBacksOff: the fetching goroutine's failed Waits in a row, a
// new goroutine's after an exit included, back off further each time,
// until a token is fetched.
func TestFailedBacksOff(t *testing.T) {
	tk := New(waitOnly{}, epoch)
	assert.Equal(t, FailureBackoff(1), tk.Failed())
	assert.Equal(t, FailureBackoff(2), tk.Failed())
	tk.Fetched()
	assert.Equal(t, FailureBackoff(1), tk.Failed(), "a token resets the count")
}

// TestTake: Take spends only a token the owner already has — one held, or
// one reserved and due — and never asks the limiter; a reservation not
// yet due stays for Ready.
func TestTake(t *testing.T) {
	var none Tokens
	assert.False(t, none.Take(sec), "no limiter: nothing to take (nothing is needed)")

	lim := rate.NewLimiter(2, 1)
	tk := New(lim, epoch)
	assert.False(t, tk.Take(sec), "nothing held: the limiter is not asked")
	assert.True(t, lim.AllowN(epoch.Add(time.Duration(sec)), 1), "the burst is still the limiter's")
	ok, at := tk.Ready(sec, nil) // reserves the token due at 1.5s
	require.False(t, ok)
	assert.False(t, tk.Take(at-1), "reserved, not yet due")
	assert.True(t, tk.Take(at), "reserved and due")
	assert.Zero(t, tk.Held())
	ok, _ = tk.Ready(at, nil)
	assert.False(t, ok, "taken: the reservation is spent")

	tk.Unspend()
	assert.True(t, tk.Take(at), "held")
	assert.False(t, tk.Take(at))
}

// panicQPS is a tryer whose QPS panics.
type panicQPS struct{ Limiter }

func (panicQPS) TryAccept() bool { return true }
func (panicQPS) QPS() float32    { panic("QPS broke") }

// TestCheckContainsQPS: Check asks QPS, user code: one that panics is an
// error, not a panic in Check's caller.
func TestCheckContainsQPS(t *testing.T) {
	var err error
	require.NotPanics(t, func() { err = Check(panicQPS{}) })
	assert.ErrorContains(t, err, "QPS broke")
}
