package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flaky is an exec whose health the test switches.
type flaky struct {
	mu    sync.Mutex
	down  bool
	calls int
}

func (f *flaky) exec(context.Context, string, int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return syscall.ECONNREFUSED
	}
	return nil
}

func (f *flaky) set(down bool) { f.mu.Lock(); f.down = down; f.mu.Unlock() }
func (f *flaky) n() int        { f.mu.Lock(); defer f.mu.Unlock(); return f.calls }

// breakerLog records the breaker's state changes as the observer sees them.
type breakerLog struct {
	NopObserver
	mu      sync.Mutex
	changes []string
}

func (b *breakerLog) OnCircuitChange(from, to Circuit) {
	b.mu.Lock()
	b.changes = append(b.changes, from.String()+">"+to.String())
	b.mu.Unlock()
}

func (b *breakerLog) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.changes...)
}

// TestBreakerTransitions walks the breaker through its states: consecutive
// retryable failures open it; while open nothing runs and calls wait in
// the queue; after the cool-down one probe runs, and its success closes the
// breaker while its failure re-opens it. The observer sees every change.
func TestBreakerTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{down: true}
		obs := &breakerLog{}
		d := newD(t, f.exec, Config[string, int]{
			Workers:  1,
			Retry:    RetryPolicy{MaxAttempts: 1},
			Breaker:  &BreakerPolicy{ConsecutiveFailures: 3, Cooldown: 10 * time.Second},
			Observer: obs,
		})
		call := func(k string) *Ticket[string, int] { return submit(t, d, k, 0, SubmitOptions{}) }
		for i := range 3 {
			<-call(fmt.Sprint("fail", i)).Done()
		}
		synctest.Wait()
		assert.Equal(t, CircuitOpen, d.Stats().Circuit, "3 retryable failures in a row trip it")

		// While open, nothing runs: the call waits in the queue.
		f.set(false)
		waiting := call("while-open")
		time.Sleep(9 * time.Second)
		synctest.Wait()
		assert.Equal(t, 3, f.n())
		assert.Equal(t, 1, d.Stats().Ready)

		// After the cool-down one probe runs; its success closes the breaker.
		time.Sleep(time.Second)
		res, err := waiting.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, StateSucceeded, res.State)
		synctest.Wait()
		assert.Equal(t, CircuitClosed, d.Stats().Circuit)

		// Trip again; a failed probe re-opens it.
		f.set(true)
		for i := range 3 {
			<-call(fmt.Sprint("again", i)).Done()
		}
		probe := call("probe")
		time.Sleep(10 * time.Second)
		<-probe.Done()
		synctest.Wait()
		assert.Equal(t, CircuitOpen, d.Stats().Circuit, "a failed probe re-opens it")

		assert.Equal(t, []string{"closed>open", "open>half_open", "half_open>closed", "closed>open", "open>half_open", "half_open>open"}, obs.all())
		closeD(t, d)
	})
}

// TestBreakerIgnoresPermanentErrors: permanent failures say nothing about
// the API's health and never trip the breaker.
func TestBreakerIgnoresPermanentErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(context.Context, string, int) error { return errors.New("400 invalid") }, Config[string, int]{
			Workers: 1,
			Breaker: &BreakerPolicy{ConsecutiveFailures: 2},
		})
		for i := range 10 {
			res, _ := submit(t, d, fmt.Sprint(i), 0, SubmitOptions{}).Wait(bg)
			require.Equal(t, StateFailed, res.State)
		}
		assert.Equal(t, CircuitClosed, d.Stats().Circuit)
		closeD(t, d)
	})
}

// TestBreakerFailureRatio: the breaker also opens when retryable failures
// reach FailureRatio of the executions in the window — but not before
// MinSamples executions.
func TestBreakerFailureRatio(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		d := newD(t, func(context.Context, string, int) error {
			n++
			if n%2 == 0 { // every other call fails: never 2 in a row
				return syscall.ECONNRESET
			}
			return nil
		}, Config[string, int]{
			Workers: 1,
			Retry:   RetryPolicy{MaxAttempts: 1},
			Breaker: &BreakerPolicy{ConsecutiveFailures: 100, FailureRatio: 0.5, MinSamples: 10},
		})
		for i := range 9 {
			<-submit(t, d, fmt.Sprint(i), 0, SubmitOptions{}).Done()
			require.Equal(t, CircuitClosed, d.Stats().Circuit, "below MinSamples after %d", i+1)
		}
		<-submit(t, d, "10th", 0, SubmitOptions{}).Done()
		assert.Equal(t, CircuitOpen, d.Stats().Circuit, "5 of 10 failed")
		closeD(t, d)
	})
}

// TestBreakerRefusesDroppable: with RefuseDroppable, droppable work for a
// new key is refused with ErrCircuitOpen while the breaker is open;
// non-droppable work still queues behind it.
func TestBreakerRefusesDroppable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(context.Context, string, int) error { return syscall.ECONNRESET }, Config[string, int]{
			Workers: 1,
			Retry:   RetryPolicy{MaxAttempts: 1},
			Breaker: &BreakerPolicy{ConsecutiveFailures: 1, RefuseDroppable: true},
		})
		<-submit(t, d, "a", 0, SubmitOptions{}).Done()
		synctest.Wait()
		require.Equal(t, CircuitOpen, d.Stats().Circuit)
		err := d.Post("b", 0, SubmitOptions{Droppable: true})
		assert.ErrorIs(t, err, ErrCircuitOpen)
		require.NoError(t, d.Post("c", 0, SubmitOptions{}), "non-droppable work still queues")
		closeD(t, d)
	})
}

// TestBreakerCooldownEndsInStats: once the cool-down has passed, the next
// call would probe, so Stats reports the circuit half-open though no call
// arrived to ask, and RefuseDroppable no longer refuses: the droppable call
// is the probe. The observer hears the move when the probe starts.
func TestBreakerCooldownEndsInStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{down: true}
		obs := &breakerLog{}
		d := newD(t, f.exec, Config[string, int]{
			Workers:  1,
			Retry:    RetryPolicy{MaxAttempts: 1},
			Breaker:  &BreakerPolicy{ConsecutiveFailures: 1, Cooldown: 10 * time.Second, RefuseDroppable: true},
			Observer: obs,
		})
		<-submit(t, d, "fail", 0, SubmitOptions{}).Done()
		synctest.Wait()
		require.Equal(t, CircuitOpen, d.Stats().Circuit)

		time.Sleep(10*time.Second - time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, CircuitOpen, d.Stats().Circuit, "still cooling down")

		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, CircuitHalfOpen, d.Stats().Circuit, "the cool-down is over: the next call probes")

		f.set(false)
		require.NoError(t, d.Post("droppable", 0, SubmitOptions{Droppable: true}), "the probe is not refused")
		synctest.Wait()
		assert.Equal(t, CircuitClosed, d.Stats().Circuit, "the probe succeeded")
		assert.Equal(t, 2, f.n())
		assert.Equal(t, []string{"closed>open", "open>half_open", "half_open>closed"}, obs.all())
		closeD(t, d)
	})
}

// TestBreakerProbeOfAnEarlierRound: BreakerPolicy.Probes bounds the
// executions while half-open. A probe still running when another
// execution's success closed the circuit does not, when it ends, give up
// the slot of a probe of a later half-open round: the circuit opened
// again, and its one probe runs alone.
func TestBreakerProbeOfAnEarlierRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(_ context.Context, k string, _ int) error {
			switch k {
			case "straggler":
				time.Sleep(3 * time.Second)
			case "fail1", "fail2":
				return syscall.ECONNRESET
			case "probe1":
				time.Sleep(4 * time.Second)
				return errors.New("400") // permanent: says nothing of health
			default:
				time.Sleep(10 * time.Second)
			}
			return nil
		}, Config[string, int]{
			Workers: 3,
			Retry:   RetryPolicy{MaxAttempts: 1},
			Breaker: &BreakerPolicy{ConsecutiveFailures: 1, Cooldown: time.Second, Probes: 1},
		})
		submit(t, d, "straggler", 0, prio(2)) // runs while closed, succeeds at 3s
		synctest.Wait()
		submit(t, d, "fail1", 0, prio(1)) // opens the circuit until 1s
		synctest.Wait()
		submit(t, d, "probe1", 0, prio(0)) // the probe at 1s, until 5s
		time.Sleep(3*time.Second + time.Millisecond)
		require.Equal(t, CircuitClosed, d.Stats().Circuit, "the straggler's success closed it")
		submit(t, d, "fail2", 0, prio(1)) // opens it again until 4s
		synctest.Wait()
		submit(t, d, "probe2", 0, prio(0))
		submit(t, d, "probe3", 0, prio(0))
		time.Sleep(2 * time.Second) // 5s: probe2 runs since 4s; probe1 ended
		s := d.Stats()
		assert.Equal(t, CircuitHalfOpen, s.Circuit)
		assert.Equal(t, 1, s.InFlight, "one probe at a time while half-open")
		closeD(t, d)
	})
}
