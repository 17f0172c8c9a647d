package scheduler

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	fwk "k8s.io/kube-scheduler/framework"
)

// recorder is a Metrics that keeps what it was told.
type recorder struct {
	mu       sync.Mutex
	executed map[fwk.APICallType][2]int // successes, errors
	elapsed  time.Duration
	pending  map[fwk.APICallType]int
}

func newRecorder() *recorder {
	return &recorder{executed: map[fwk.APICallType][2]int{}, pending: map[fwk.APICallType]int{}}
}

func (r *recorder) Executed(t fwk.APICallType, err error, elapsed time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.executed[t]
	if err != nil {
		n[1]++
	} else {
		n[0]++
	}
	r.executed[t] = n
	r.elapsed += elapsed
}

func (r *recorder) Pending(t fwk.APICallType, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending[t] = n
}

func (r *recorder) snapshot() (map[fwk.APICallType][2]int, map[fwk.APICallType]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ex := map[fwk.APICallType][2]int{}
	for k, v := range r.executed {
		ex[k] = v
	}
	p := map[fwk.APICallType]int{}
	for k, v := range r.pending {
		p[k] = v
	}
	return ex, p
}

// TestMetrics: Executed is told each execution, retries included, with
// its result and time; Pending follows the calls waiting by type — queued,
// behind a call in flight, in a retry's backoff — and is 0 for every type
// once they have run.
func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		d := newIdleDispatcher(t, Options{Workers: 2, Metrics: r})
		j := &journal{}
		hold := newHolder()
		inFlight := newCall(j, "held", podStatusPatch, "1", "x")
		inFlight.exec = hold.exec
		require.NoError(t, d.Add(inFlight, fwk.APICallOptions{}))
		flaky := newCall(j, "flaky", podBinding, "2", "x")
		failures := 1
		flaky.exec = func(context.Context, *testCall) error {
			time.Sleep(time.Millisecond)
			if failures > 0 {
				failures--
				return errRetryable
			}
			return nil
		}
		require.NoError(t, d.Add(flaky, fwk.APICallOptions{}))
		d.Start(testLogger(t))
		<-hold.arrived
		require.NoError(t, d.Add(newCall(j, "successor", podStatusPatch, "1", "y"), fwk.APICallOptions{}))
		require.NoError(t, d.Add(newCall(j, "other", "plugin_call", "3", "y"), fwk.APICallOptions{}))
		synctest.Wait()
		_, pending := r.snapshot()
		assert.Equal(t, 1, pending[podStatusPatch], "the successor waits behind the call in flight")

		hold.release <- struct{}{}
		time.Sleep(time.Minute)
		synctest.Wait()
		executed, pending := r.snapshot()
		assert.Equal(t, map[fwk.APICallType][2]int{
			podStatusPatch: {2, 0},
			podBinding:     {1, 1}, // one retry
			"plugin_call":  {1, 0},
		}, executed)
		for typ, n := range pending {
			assert.Zero(t, n, "pending %s after everything ran", typ)
		}
		assert.Contains(t, pending, fwk.APICallType("plugin_call"))
		assert.Equal(t, uint64(1), d.Stats().Retries)
		assert.Equal(t, dispatch.ModeAsync, d.Mode())
	})
}

// TestPendingCountsARetryInBackoff pins that Pending counts a call waiting
// out a retry's backoff, shortly after it starts waiting: a binding that
// failed with a retryable error is reported pending during its 10s backoff,
// and no longer once it has run.
func TestPendingCountsARetryInBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		d := newIdleDispatcher(t, Options{Workers: 2, Metrics: r,
			Retry: dispatch.RetryPolicy{InitialBackoff: 10 * time.Second, Jitter: dispatch.JitterNone, BudgetRatio: 1}})
		d.Start(testLogger(t))
		j := &journal{}
		c := newCall(j, "flaky", podBinding, "1", "x")
		failures := 1
		c.exec = func(context.Context, *testCall) error {
			time.Sleep(100 * time.Millisecond)
			if failures > 0 {
				failures--
				return errRetryable
			}
			return nil
		}
		ch := make(chan error, 1)
		require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: ch}))
		time.Sleep(time.Second) // the first attempt failed; the retry waits 10s
		synctest.Wait()
		require.Equal(t, 1, d.core.Queued(string(podBinding)), "the core counts the retry as waiting")
		_, pending := r.snapshot()
		assert.Equal(t, 1, pending[podBinding], "pending while the retry waits out its backoff")

		time.Sleep(20 * time.Second)
		synctest.Wait()
		require.NoError(t, <-ch)
		_, pending = r.snapshot()
		assert.Zero(t, pending[podBinding])
	})
}

// TestPendingFromStart checks what the README's Metrics difference and
// Metrics.Pending's doc say of the pending count before Start: it is not
// reported until Start, which reports the calls added before it at once,
// and a dispatcher closed before Start never reports it.
func TestPendingFromStart(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("metrics.go")
	require.NoError(t, err)
	flat := func(b []byte) string {
		return strings.Join(strings.Fields(strings.ReplaceAll(string(b), "//", "")), " ")
	}
	require.Contains(t, flat(readme), "That goroutine starts with `Run`: the calls added before it are counted when it starts, and a dispatcher closed before `Run` never sets the gauge")
	require.Contains(t, flat(src), "It is called from one goroutine, which Start starts: at once, for the calls added before Start, then shortly after the number changes, and once more when the dispatcher closes. Before Start it is not called, and a dispatcher closed before Start never calls it.")

	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		d := newIdleDispatcher(t, Options{Workers: 1, Metrics: r})
		hold := newHolder()
		a := newCall(&journal{}, "a", podBinding, "1", "x")
		a.exec = hold.exec
		require.NoError(t, d.Add(a, fwk.APICallOptions{}))
		require.NoError(t, d.Add(newCall(&journal{}, "b", podBinding, "2", "x"), fwk.APICallOptions{}))
		synctest.Wait()
		_, pending := r.snapshot()
		assert.Empty(t, pending, "not reported before Start")
		d.Start(testLogger(t))
		<-hold.arrived
		synctest.Wait()
		_, pending = r.snapshot()
		assert.Equal(t, 1, pending[podBinding], "reported from Start on: b waits for the one worker")
		hold.release <- struct{}{}
	})

	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		d := newIdleDispatcher(t, Options{Metrics: r})
		require.NoError(t, d.Add(newCall(&journal{}, "a", podBinding, "1", "x"), fwk.APICallOptions{}))
		require.ErrorIs(t, d.Close(context.Background()), context.Canceled, "closed before Start: ended at once")
		_, pending := r.snapshot()
		assert.Empty(t, pending, "a dispatcher closed before Start never reports")
	})
}

// TestExecutedAfterAPanic: Executed is told every execution, one whose
// Execute panicked (the dispatcher contains it: the call fails) included,
// as an error; a paced status patch's time counts too.
func TestExecutedAfterAPanic(t *testing.T) {
	r := newRecorder()
	d := newTestDispatcher(t, Options{Metrics: r})
	c := newCall(&journal{}, "a", typeLow, "1", "x")
	c.exec = func(context.Context, *testCall) error { panic("boom") }
	ch := make(chan error, 1)
	require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: ch}))
	var pe *dispatch.PanicError
	require.ErrorAs(t, outcome(t, ch), &pe)
	executed, _ := r.snapshot()
	assert.Equal(t, [2]int{0, 1}, executed[typeLow], "one execution, an error")
}

// executedWhere is a Metrics that records whether Executed ran on the
// goroutine of TestExecutedWhereItRan.
type executedWhere struct {
	mu       sync.Mutex
	inCaller []bool
}

func (m *executedWhere) Executed(fwk.APICallType, error, time.Duration) {
	here := strings.Contains(string(debug.Stack()), "TestExecutedWhereItRan")
	m.mu.Lock()
	m.inCaller = append(m.inCaller, here)
	m.mu.Unlock()
}

func (m *executedWhere) Pending(fwk.APICallType, int) {}

// TestExecutedWhereItRan: Metrics.Executed is called on the goroutine that
// ran the execution, as its documentation says: a worker in Async mode,
// Add's caller in Sync mode.
func TestExecutedWhereItRan(t *testing.T) {
	text := fileDoc(t, "metrics.go")
	const doc = "It is called on the goroutine that ran the execution — a worker, or, in dispatch.ModeSync, the Add that ran it inline — after every execution, retries included."
	require.True(t, strings.Contains(text, doc), "Metrics.Executed's documentation says %q", doc)
	for _, mode := range []dispatch.Mode{dispatch.ModeAsync, dispatch.ModeSync} {
		t.Run(mode.String(), func(t *testing.T) {
			m := &executedWhere{}
			d := newTestDispatcher(t, Options{Metrics: m, Rollout: dispatch.RolloutPolicy{Mode: mode}})
			tk, err := d.Submit(newCall(&journal{}, "a", typeLow, "1", "x"), fwk.APICallOptions{})
			require.NoError(t, err)
			<-tk.Done()
			m.mu.Lock()
			defer m.mu.Unlock()
			assert.Equal(t, []bool{mode == dispatch.ModeSync}, m.inCaller)
		})
	}
}

// closeOnPending is a Metrics whose first Pending closes the dispatcher.
type closeOnPending struct {
	d    *Dispatcher
	once sync.Once
	err  chan error
}

func (m *closeOnPending) Executed(fwk.APICallType, error, time.Duration) {}

func (m *closeOnPending) Pending(fwk.APICallType, int) {
	m.once.Do(func() { m.err <- m.d.Close(context.Background()) })
}

// TestCloseFromMetricsPending: Close called from Metrics.Pending, on the
// goroutine that reports the pending count, waited for that goroutine —
// itself — for ever. It takes effect (what is queued runs, as Close's
// context allows), returns an error matching dispatch.ErrReentrant
// without waiting for itself, and a later Close waits for that goroutine.
func TestCloseFromMetricsPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &closeOnPending{err: make(chan error, 1)}
		d := newIdleDispatcher(t, Options{Metrics: m})
		m.d = d
		j := &journal{}
		ch := make(chan error, 1)
		require.NoError(t, d.Add(newCall(j, "a", typeLow, "1", "x"), fwk.APICallOptions{OnFinish: ch}))
		d.Start(testLogger(t)) // reports the call's type: Pending closes
		select {
		case err := <-m.err:
			assert.ErrorIs(t, err, dispatch.ErrReentrant)
		case <-time.After(time.Hour):
			t.Fatal("Close from Metrics.Pending did not return")
		}
		assert.NoError(t, <-ch, "the queued call ran: Close drained")
		require.NoError(t, d.Close(context.Background()), "a later Close waits for the goroutine")
		assert.ErrorIs(t, d.Add(newCall(j, "b", typeLow, "2", "x"), fwk.APICallOptions{}), dispatch.ErrClosed)
	})
}

// misbehaving is a recorder whose methods, while armed, panic or end their
// goroutine (runtime.Goexit) instead.
type misbehaving struct {
	*recorder
	mu                sync.Mutex
	executed, pending func()
}

func (m *misbehaving) arm(executed, pending func()) {
	m.mu.Lock()
	m.executed, m.pending = executed, pending
	m.mu.Unlock()
}

func (m *misbehaving) Executed(t fwk.APICallType, err error, elapsed time.Duration) {
	m.mu.Lock()
	f := m.executed
	m.mu.Unlock()
	if f != nil {
		f()
	}
	m.recorder.Executed(t, err, elapsed)
}

func (m *misbehaving) Pending(t fwk.APICallType, n int) {
	m.mu.Lock()
	f := m.pending
	m.mu.Unlock()
	if f != nil {
		f()
	}
	m.recorder.Pending(t, n)
}

// TestMetricsCallbackPanics: Metrics is user code, and a panic in it is
// contained as the dispatcher's other callbacks' are — logged as an
// internal error and counted in Stats.CallbackPanics. A panic in Executed,
// told after the call's Execute returned, does not change the call's
// outcome (it ended Failed, "exec panicked", though it had landed); one
// in Pending, on the goroutine that reports it, does not end the process,
// and the pending count goes on being reported; nor does a Pending that
// ends its goroutine (runtime.Goexit). (On the real clock: the log's
// utilruntime.HandleError waits out a backoff that, read from a synctest
// bubble's clock, is years, past the calls' deadlines.)
func TestMetricsCallbackPanics(t *testing.T) {
	for _, c := range []struct {
		name              string
		executed, pending func()
	}{
		{"Executed panics", func() { panic("executed") }, nil},
		{"Pending panics", nil, func() { panic("pending") }},
		{"Pending exits", nil, runtime.Goexit},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &misbehaving{recorder: newRecorder()}
			m.arm(c.executed, c.pending)
			d := newIdleDispatcher(t, Options{Metrics: m})
			j := &journal{}
			ch := make(chan error, 1)
			require.NoError(t, d.Add(newCall(j, "a", typeLow, "1", "x"), fwk.APICallOptions{OnFinish: ch}))
			d.Start(testLogger(t))
			assert.NoError(t, outcome(t, ch), "its Execute succeeded")
			require.Eventually(t, func() bool { return d.Stats().CallbackPanics > 0 }, 10*time.Second, time.Millisecond)
			s := d.Stats()
			require.NotNil(t, s.LastCallbackPanic)
			assert.Contains(t, s.LastCallbackPanic.Callback, "metrics")

			// Disarmed, the metrics go on.
			m.arm(nil, nil)
			hold := newHolder()
			b := newCall(j, "b", typeLow, "2", "x")
			b.exec = hold.exec
			require.NoError(t, d.Add(b, fwk.APICallOptions{}))
			<-hold.arrived
			require.NoError(t, d.Add(newCall(j, "c", typeLow, "2", "y"), fwk.APICallOptions{}))
			require.Eventually(t, func() bool { _, p := m.snapshot(); return p[typeLow] == 1 }, 10*time.Second, time.Millisecond, "c waits behind b")
			hold.release <- struct{}{}
			want := 3 // a, b and c
			if c.executed != nil {
				want = 2 // a's Executed panicked before it was recorded
			}
			require.Eventually(t, func() bool {
				ex, p := m.snapshot()
				return p[typeLow] == 0 && ex[typeLow][0] == want
			}, 10*time.Second, time.Millisecond)
			require.NoError(t, d.Close(context.Background()))
		})
	}
}
