package tokens

import (
	"context"
	"errors"
	"math"
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
	ok, _ := tk.Ready(1)
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
	ok, _ := tk.Ready(sec)
	require.True(t, ok, "the burst")
	tk.Spend()
	ok, at := tk.Ready(sec)
	assert.False(t, ok)
	assert.Equal(t, sec+sec/2, at, "the next token at 2/s")
	ok, _ = tk.Ready(at)
	assert.True(t, ok, "due: handed out")
	ok, _ = tk.Ready(at)
	assert.True(t, ok, "held until spent")
	tk.Spend()

	slow := New(rate.NewLimiter(rate.Every(time.Minute), 1), epoch)
	slow.Ready(sec)
	slow.Spend()
	ok, at = slow.Ready(sec)
	assert.False(t, ok)
	assert.Equal(t, sec+MaxWait, at, "a reservation beyond MaxWait is asked again then")

	paused := rate.NewLimiter(rate.Limit(math.NaN()), 1)
	p := New(paused, epoch)
	ok, at = p.Ready(sec)
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
	ok, at := tk.Ready(sec)
	assert.False(t, ok)
	assert.Equal(t, sec+sec/4, at, "tried again a token interval later")
	l.grant = true
	ok, _ = tk.Ready(sec + 1)
	assert.False(t, ok, "not before that time")
	ok, _ = tk.Ready(at)
	assert.True(t, ok)
}

type waitOnly struct{ err error }

func (w waitOnly) Wait(context.Context) error { return w.err }

func TestFetched(t *testing.T) {
	tk := New(waitOnly{}, epoch)
	require.True(t, tk.NeedsFetcher())
	assert.False(t, tk.WantFetch(3), "nobody asked")
	ok, at := tk.Ready(sec)
	assert.False(t, ok)
	assert.Equal(t, int64(WhenFetched), at)
	assert.True(t, tk.WantFetch(0), "asked: one at least")
	tk.Fetched()
	assert.False(t, tk.WantFetch(0), "one held")
	ok, _ = tk.Ready(sec)
	assert.True(t, ok)
	tk.Spend()

	// Three free workers with calls to start: fetched until three are
	// held, then the ask is answered.
	_, _ = tk.Ready(sec)
	for range 3 {
		assert.True(t, tk.WantFetch(3))
		tk.Fetched()
	}
	assert.False(t, tk.WantFetch(3))
	assert.False(t, tk.WantFetch(5), "answered: no more fetched until a worker asks again")
	for range 3 {
		ok, _ = tk.Ready(sec)
		assert.True(t, ok)
		tk.Spend()
	}
	ok, _ = tk.Ready(sec)
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
	ok, at := tk.Ready(sec)
	assert.False(t, ok)
	assert.Equal(t, int64(WhenFetched), at)
	assert.True(t, tk.WantFetch(1), "refused: the goroutine is asked")
	tk.Fetched()
	assert.False(t, tk.WantFetch(1), "one held: the ask is answered")
	ok, _ = tk.Ready(sec)
	assert.True(t, ok, "the fetched token")
	assert.Equal(t, 1, l.tries, "a held token is spent before Allow is tried again")
	tk.Spend()

	l.open = true
	for range 3 {
		ok, _ = tk.Ready(sec)
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
		err := Wait(ctx, waitOnly{errors.New("refused")})
		assert.Error(t, err)
		assert.Equal(t, 100*time.Millisecond, time.Since(start), "retried until ctx ended")
		assert.Equal(t, 10*time.Millisecond, FailureBackoff(1))
		assert.Equal(t, time.Duration(MaxWait), FailureBackoff(100))
	})
}
