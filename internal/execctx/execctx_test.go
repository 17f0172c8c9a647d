package execctx

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLiveContext(t *testing.T) {
	dl := time.Unix(100, 0)
	ctx := New(dl, "op-1")
	got, ok := ctx.Deadline()
	assert.True(t, ok)
	assert.Equal(t, dl, got)
	assert.NoError(t, ctx.Err())
	assert.Equal(t, "op-1", ctx.Value(IdemKey{}))
	assert.Nil(t, ctx.Value("other"), "a live context holds no other value")
	select {
	case <-ctx.Done():
		t.Fatal("done before Cancel")
	default:
	}
	_, ok = New(time.Time{}, "").Deadline()
	assert.False(t, ok, "zero deadline: none")
	assert.Nil(t, New(time.Time{}, "").Value(IdemKey{}), "no idempotency key reads as nil")
}

// TestDeadlineSaturates: a deadline outside what Unix nanoseconds hold
// reads as the nearest one they hold, not wrapped around to the other
// side; the Unix epoch itself is still a deadline.
func TestDeadlineSaturates(t *testing.T) {
	for _, c := range []struct{ in, want time.Time }{
		{time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MaxInt64)},
		{time.Unix(0, math.MaxInt64).Add(time.Duration(math.MaxInt64)), time.Unix(0, math.MaxInt64)},
		{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MinInt64)},
		{time.Unix(0, 0), time.Unix(0, -1)},
		{time.Unix(100, 5), time.Unix(100, 5)},
	} {
		got, ok := New(c.in, "").Deadline()
		require.True(t, ok, "%v", c.in)
		assert.True(t, got.Equal(c.want), "%v read as %v, want %v", c.in, got, c.want)
	}
}

func TestCancel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		expired bool
		want    error
	}{{"canceled", false, context.Canceled}, {"expired", true, context.DeadlineExceeded}} {
		t.Run(tc.name, func(t *testing.T) {
			cause := errors.New("why")
			ctx := New(time.Time{}, "")
			done := ctx.Done() // made before: closed by Cancel
			ctx.Cancel(cause, tc.expired)
			<-done
			assert.ErrorIs(t, ctx.Err(), tc.want)
			assert.Same(t, cause, context.Cause(ctx))
			ctx.Cancel(errors.New("later"), !tc.expired)
			assert.ErrorIs(t, ctx.Err(), tc.want, "only the first Cancel counts")
			assert.Same(t, cause, context.Cause(ctx))
		})
	}
	ctx := New(time.Time{}, "")
	ctx.Cancel(errors.New("first"), false)
	<-ctx.Done() // made after: already closed
}

// TestEndedCause: the usual cause, Ended, is recorded without making the
// context's extra, and reported as any other cause is; other causes, and
// none, are reported as before.
func TestEndedCause(t *testing.T) {
	was := Ended
	Ended = errors.New("ended")
	t.Cleanup(func() { Ended = was })

	ctx := New(time.Time{}, "")
	assert.Equal(t, 1.0, testing.AllocsPerRun(100, func() {
		ctx = New(time.Time{}, "")
		ctx.Cancel(Ended, false)
	}), "the context itself, and nothing for its cause")
	assert.Nil(t, ctx.x, "Ended needs no extra")
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	assert.Same(t, Ended, context.Cause(ctx))
	ctx.Cancel(errors.New("later"), true)
	assert.Same(t, Ended, context.Cause(ctx), "only the first Cancel counts")

	other := errors.New("other")
	ctx = New(time.Time{}, "op")
	ctx.Cancel(other, true)
	assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	assert.Same(t, other, context.Cause(ctx))
	assert.Equal(t, "op", ctx.Value(IdemKey{}), "the cause shares the extra with the idempotency key")

	ctx = New(time.Time{}, "")
	ctx.Cancel(nil, false)
	assert.Same(t, context.Canceled, context.Cause(ctx), "no cause reads as context.Canceled, as context.WithCancelCause's")

	Ended = nil // an owner that set none: nil is still no cause
	ctx = New(time.Time{}, "")
	ctx.Cancel(nil, false)
	assert.False(t, ctx.ended)
	assert.Same(t, context.Canceled, context.Cause(ctx))
}

func TestDerivedContexts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := errors.New("deleted")
		ctx := New(time.Time{}, "")
		child, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		ran := make(chan struct{})
		context.AfterFunc(ctx, func() { close(ran) })
		stop := context.AfterFunc(ctx, func() { t.Error("a stopped AfterFunc ran") })
		require.True(t, stop(), "stop before cancellation reports true")
		ctx.Cancel(cause, false)
		<-child.Done()
		<-ran
		assert.Same(t, cause, context.Cause(child), "a derived context inherits the cause")
		synctest.Wait()

		// After cancellation a registration runs at once, on its own goroutine.
		late := make(chan struct{})
		stop = ctx.AfterFunc(func() { close(late) })
		<-late
		assert.False(t, stop(), "nothing to stop once run")
	})
}

// TestStoppedAfterFuncDropped pins that a context derived from a Ctx and
// cancelled is let go, as a context.WithCancelCause parent lets go of it:
// stop takes its registration out at once, rather than leaving it (and the
// derived context its f holds) until the Ctx is cancelled. stop still
// reports whether it stopped f, and every f not stopped runs once.
func TestStoppedAfterFuncDropped(t *testing.T) {
	ctx := New(time.Time{}, "")
	for range 10000 {
		_, cancel := context.WithCancel(ctx)
		cancel()
	}
	assert.Zero(t, len(ctx.x.afters), "derived and cancelled: nothing held")

	// Stopped in any order among live ones, with a burst to shrink from.
	const n = 1000
	runs := make([]int, n)
	stops := make([]func() bool, n)
	for i := range n {
		stops[i] = ctx.AfterFunc(func() { runs[i]++ })
	}
	stopped := func(i int) bool { return i%5 != 0 }
	for i := 1; i < n; i += 2 { // odd ones from the front, even from the back
		if stopped(i) {
			require.True(t, stops[i](), "stop before cancellation reports true")
			require.False(t, stops[i](), "and only the first time")
		}
	}
	for i := n - 2; i >= 0; i -= 2 {
		if stopped(i) {
			require.True(t, stops[i]())
		}
	}
	live := len(ctx.x.afters)
	assert.Equal(t, n/5, live, "only the registrations not stopped are held")
	assert.Less(t, cap(ctx.x.afters), n, "the burst's peak is not kept")
	ctx.Cancel(errors.New("end"), false)
	ran := 0
	for i := range n {
		if stopped(i) {
			assert.Zero(t, runs[i], "a stopped f never runs")
			continue
		}
		assert.Equal(t, 1, runs[i], "f runs once")
		assert.False(t, stops[i](), "nothing to stop once run")
		ran++
	}
	assert.Equal(t, live, ran)
}

// TestDoneRace asks for Done from many goroutines while another cancels:
// every one gets the same channel, closed (run with -race).
func TestDoneRace(t *testing.T) {
	for range 100 {
		ctx := New(time.Time{}, "")
		var wg sync.WaitGroup
		chans := make([]<-chan struct{}, 4)
		for i := range chans {
			wg.Go(func() { chans[i] = ctx.Done() })
		}
		wg.Go(func() { ctx.Cancel(errors.New("end"), false) })
		wg.Wait()
		for _, ch := range chans {
			assert.Equal(t, chans[0], ch, "one Done channel")
			<-ch
		}
		assert.Equal(t, chans[0], ctx.Done())
	}
}

// TestSize: every execution allocates a Ctx, so it stays small; the
// package doc states the figure, and this reads it there.
func TestSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the figure is for 64-bit platforms")
	}
	assert.LessOrEqual(t, unsafe.Sizeof(Ctx{}), uintptr(40))
	src, err := os.ReadFile("execctx.go")
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(src)), " ")
	assert.Contains(t, doc, fmt.Sprintf("— %d bytes on a 64-bit platform —", unsafe.Sizeof(Ctx{})))
	dl := time.Now()
	assert.Equal(t, 1.0, testing.AllocsPerRun(100, func() { sink = New(dl, "") }), "a deadline costs no allocation of its own")
}

var sink *Ctx
