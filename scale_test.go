package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// BenchmarkScale is the cost as the work grows: queued calls of distinct
// keys (ints), priorities drawn from 10 levels, with no deadline or each
// with a deadline of its own (an hour ahead, so none expires). At each
// size:
//
//   - op=post: a new key's Post into the backlog, as in BenchmarkSubmit; it
//     also reports B/queued, the heap the backlog holds per queued call
//     (runtime.MemStats.HeapAlloc after a GC, less the same before it, over
//     the calls; the keys and values are ints, so this is the dispatcher's
//     own memory);
//   - op=cycle: one worker takes the best call, runs a no-op exec and ends
//     it; the exec Posts a new key, so the backlog stays at its size. The
//     time is per execution, that Post included;
//   - op=close-drain, op=close-cancel: Close of a parked backlog with a
//     context that lets it drain (one worker running every call) or one
//     already cancelled (every call ends ErrClosed).
//
// test/benchmarks and test/crqueue run the same sizes against client-go's
// workqueue and controller-runtime's priorityqueue under the same names.
func BenchmarkScale(b *testing.B) {
	for _, n := range benchQueued {
		for _, dl := range []string{"none", "own"} {
			name := fmt.Sprintf("impl=dispatch/queued=%d/deadline=%s", n, dl)
			b.Run(name+"/op=post", func(b *testing.B) { scalePost(b, n, dl == "own") })
			b.Run(name+"/op=cycle", func(b *testing.B) { scaleCycle(b, n, dl == "own") })
			b.Run(name+"/op=close-drain", func(b *testing.B) { scaleClose(b, n, dl == "own", true) })
			b.Run(name+"/op=close-cancel", func(b *testing.B) { scaleClose(b, n, dl == "own", false) })
			settle()
		}
	}
}

// scaleOpts are the options of key k's call: its priority, and its own
// deadline if deadlines.
type scaleOpts struct {
	prios     []int
	deadlines bool
	base      time.Time
}

func newScaleOpts(n int, deadlines bool) scaleOpts {
	return scaleOpts{prios: benchPrios(n, 10), deadlines: deadlines, base: time.Now().Add(time.Hour)}
}

func (s scaleOpts) of(k int) SubmitOptions {
	o := SubmitOptions{Priority: s.prios[k%len(s.prios)]}
	if s.deadlines {
		o.Deadline = s.base.Add(time.Duration(k))
	}
	return o
}

// heapAlloc is the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// scaleParked returns a dispatcher of one worker, parked on a call of key
// -1 until release is closed, and then running exec, holding n queued calls.
func scaleParked(b testing.TB, n int, s scaleOpts, exec ExecFunc[int, int]) (d *Dispatcher[int, int], release chan struct{}) {
	b.Helper()
	release = make(chan struct{})
	d, err := New(func(ctx context.Context, k, v int) error {
		if k == -1 {
			<-release
			return nil
		}
		return exec(ctx, k, v)
	}, Config[int, int]{Workers: 1, Capacity: 2*n + 2})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Post(-1, 0, SubmitOptions{}); err != nil {
		b.Fatal(err)
	}
	for d.Stats().InFlight != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	for k := range n {
		if err := d.Post(k, k, s.of(k)); err != nil {
			b.Fatal(err)
		}
	}
	return d, release
}

// queuedBytes returns the heap that n queued calls hold, per call, as
// BenchmarkScale's B/queued reports it, and the parked dispatcher that
// holds them (end it with scaleEnd).
func queuedBytes(tb testing.TB, n int, s scaleOpts) (float64, *Dispatcher[int, int], chan struct{}) {
	settle()
	before := heapAlloc()
	d, release := scaleParked(tb, n, s, func(context.Context, int, int) error { return nil })
	return float64(heapAlloc()-before) / float64(n), d, release
}

// TestQueuedBytesDoc keeps the package doc's memory per queued call true
// at 10³ and 10⁵ queued, with and without deadlines (10⁶, in the same
// range, is BenchmarkScale's). At 10⁵ the figure repeats to a tenth of a
// byte from run to run, at 10³ it moves by several (212–214 bytes, and
// 230–236 with deadlines, in runs here); the doc's range leaves room each
// side.
func TestQueuedBytesDoc(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the figures are a 64-bit platform's")
	}
	const lo, hi, dlLo, dlHi = 190, 230, 210, 250
	docSays(t, "", fmt.Sprintf("a queued call holds %d–%d bytes of memory with int keys and values, %d–%d with a deadline of its own", lo, hi, dlLo, dlHi))
	for _, n := range []int{1_000, 100_000} {
		for _, deadlines := range []bool{false, true} {
			// In a bubble, so that scaleParked's wait for its worker is on
			// the fake clock.
			synctest.Test(t, func(t *testing.T) {
				got, d, release := queuedBytes(t, n, newScaleOpts(n, deadlines))
				scaleEnd(t, d, release, false)
				t.Logf("%d queued, deadlines %v: %.1f bytes a call", n, deadlines, got)
				if deadlines {
					assert.InDelta(t, (dlLo+dlHi)/2.0, got, (dlHi-dlLo)/2.0, "%d queued, with deadlines", n)
				} else {
					assert.InDelta(t, (lo+hi)/2.0, got, (hi-lo)/2.0, "%d queued", n)
				}
			})
		}
	}
}

func scalePost(b *testing.B, n int, deadlines bool) {
	s := newScaleOpts(n, deadlines)
	held, d, release := queuedBytes(b, n, s)
	k0 := n
	loopBatched(b, benchBatch(n), func(i int) {
		if err := d.Post(k0+i, i, s.of(k0+i)); err != nil {
			b.Fatal(err)
		}
	}, func(lo, hi int) {
		for k := lo; k < hi; k++ {
			d.Cancel(k0+k, nil)
		}
	})
	b.ReportMetric(held, "B/queued")
	if st := d.Stats(); st.Ready != n {
		b.Fatalf("backlog drifted: ready=%d, want %d", st.Ready, n)
	}
	scaleEnd(b, d, release, false)
}

func scaleCycle(b *testing.B, n int, deadlines bool) {
	s := newScaleOpts(n, deadlines)
	var (
		d      *Dispatcher[int, int]
		ran    atomic.Int64
		target atomic.Int64
		next   = int64(n)
		done   = make(chan struct{})
	)
	target.Store(-1)
	d, release := scaleParked(b, n, s, func(_ context.Context, _, _ int) error {
		k := int(next) // one worker: no other exec runs at once
		next++
		if err := d.Post(k, k, s.of(k)); err != nil && !errors.Is(err, ErrClosed) {
			b.Error(err)
		}
		if ran.Add(1) == target.Load() {
			close(done)
		}
		return nil
	})
	settle()
	b.ReportAllocs()
	b.ResetTimer()
	target.Store(int64(b.N))
	close(release)
	<-done
	b.StopTimer()
	scaleEnd(b, d, nil, false)
}

func scaleClose(b *testing.B, n int, deadlines bool, drain bool) {
	s := newScaleOpts(n, deadlines)
	b.ReportAllocs()
	for range b.N {
		b.StopTimer()
		d, release := scaleParked(b, n, s, func(context.Context, int, int) error { return nil })
		settle()
		b.StartTimer()
		scaleEnd(b, d, release, drain)
		b.StopTimer()
		if st := d.Stats(); st.Live != 0 {
			b.Fatalf("live calls after Close: %d", st.Live)
		}
	}
}

// scaleEnd closes d, letting it drain the backlog or ending it at once,
// after releasing its parked worker (if release is not nil).
func scaleEnd(b testing.TB, d *Dispatcher[int, int], release chan struct{}, drain bool) {
	ctx, cancel := context.WithCancel(context.Background())
	if !drain {
		cancel()
	}
	defer cancel()
	if release != nil {
		close(release)
	}
	if err := d.Close(ctx); drain && err != nil {
		b.Fatal(err)
	}
}
