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

func (b *breakerLog) OnBreakerChange(from, to BreakerState) {
	b.mu.Lock()
	b.changes = append(b.changes, from.String()+">"+to.String())
	b.mu.Unlock()
}

func (b *breakerLog) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.changes...)
}

func TestBreakerTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{down: true}
		obs := &breakerLog{}
		d, err := New(f.exec, Config[string, int]{Workers: 1, Retry: RetryPolicy{MaxAttempts: 1},
			Breaker:  &BreakerPolicy{ConsecutiveFailures: 3, Cooldown: 10 * time.Second},
			Observer: obs})
		require.NoError(t, err)
		submit := func(k string) *Ticket[string, int] {
			tk, err := d.Submit(t.Context(), k, 0, SubmitOptions{})
			require.NoError(t, err)
			return tk
		}
		for i := range 3 {
			<-submit(fmt.Sprint("fail", i)).Done()
		}
		synctest.Wait()
		assert.Equal(t, BreakerOpen, d.Stats().Breaker, "3 retryable failures in a row trip it")

		// While open, nothing runs: the call waits in the queue.
		f.set(false)
		waiting := submit("while-open")
		time.Sleep(9 * time.Second)
		synctest.Wait()
		assert.Equal(t, 3, f.n())
		assert.Equal(t, 1, d.Stats().Ready)

		// After the cool-down one probe runs; its success closes the breaker.
		time.Sleep(time.Second)
		res, err := waiting.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Succeeded, res.State)
		synctest.Wait()
		assert.Equal(t, BreakerClosed, d.Stats().Breaker)

		// Trip again; a failed probe re-opens it.
		f.set(true)
		for i := range 3 {
			<-submit(fmt.Sprint("again", i)).Done()
		}
		probe := submit("probe")
		time.Sleep(10 * time.Second)
		<-probe.Done()
		synctest.Wait()
		assert.Equal(t, BreakerOpen, d.Stats().Breaker, "a failed probe re-opens it")

		assert.Equal(t, []string{"closed>open", "open>half-open", "half-open>closed", "closed>open", "open>half-open", "half-open>open"}, obs.all())
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestBreakerIgnoresPermanentErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := New(func(context.Context, string, int) error { return errors.New("400 invalid") },
			Config[string, int]{Workers: 1, Breaker: &BreakerPolicy{ConsecutiveFailures: 2}})
		require.NoError(t, err)
		for i := range 10 {
			tk, err := d.Submit(t.Context(), fmt.Sprint(i), 0, SubmitOptions{})
			require.NoError(t, err)
			res, _ := tk.Wait(t.Context())
			require.Equal(t, Failed, res.State)
		}
		assert.Equal(t, BreakerClosed, d.Stats().Breaker)
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestBreakerFailureRatio(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		d, err := New(func(context.Context, string, int) error {
			n++
			if n%2 == 0 { // every other call fails: never 2 in a row
				return syscall.ECONNRESET
			}
			return nil
		}, Config[string, int]{Workers: 1, Retry: RetryPolicy{MaxAttempts: 1}, Breaker: &BreakerPolicy{ConsecutiveFailures: 100, FailureRatio: 0.5, MinSamples: 10}})
		require.NoError(t, err)
		for i := range 9 {
			tk, err := d.Submit(t.Context(), fmt.Sprint(i), 0, SubmitOptions{})
			require.NoError(t, err)
			<-tk.Done()
			require.Equal(t, BreakerClosed, d.Stats().Breaker, "below MinSamples after %d", i+1)
		}
		tk, err := d.Submit(t.Context(), "10th", 0, SubmitOptions{})
		require.NoError(t, err)
		<-tk.Done()
		assert.Equal(t, BreakerOpen, d.Stats().Breaker, "5 of 10 failed")
		require.NoError(t, d.Close(t.Context()))
	})
}

func TestBreakerRefusesDroppable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := New(func(context.Context, string, int) error { return syscall.ECONNRESET },
			Config[string, int]{Workers: 1, Retry: RetryPolicy{MaxAttempts: 1}, Breaker: &BreakerPolicy{ConsecutiveFailures: 1, RefuseDroppable: true}})
		require.NoError(t, err)
		tk, err := d.Submit(t.Context(), "a", 0, SubmitOptions{})
		require.NoError(t, err)
		<-tk.Done()
		synctest.Wait()
		require.Equal(t, BreakerOpen, d.Stats().Breaker)
		err = d.Post("b", 0, SubmitOptions{Droppable: true})
		assert.ErrorIs(t, err, ErrCircuitOpen)
		require.NoError(t, d.Post("c", 0, SubmitOptions{}), "non-droppable work still queues")
		require.NoError(t, d.Close(t.Context()))
	})
}
