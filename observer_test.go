package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingObserver counts every event, by kind and label.
type countingObserver struct {
	mu     sync.Mutex
	counts map[string]int
	labels map[string]int
}

func newCountingObserver() *countingObserver {
	return &countingObserver{counts: map[string]int{}, labels: map[string]int{}}
}

func (o *countingObserver) add(kind string, e Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[kind]++
	o.labels[kind+":"+e.Label]++
}

func (o *countingObserver) OnSubmit(e Event, coalesced bool) {
	o.add("submit", e)
	if coalesced {
		o.add("coalesced", e)
	}
}
func (o *countingObserver) OnCoalesce(e Event)                                 { o.add("coalesced", e) }
func (o *countingObserver) OnReject(e Event, err error)                        { o.add("reject", e) }
func (o *countingObserver) OnStart(e Event, n int, w time.Duration)            { o.add("start", e) }
func (o *countingObserver) OnRetry(e Event, n int, d time.Duration, err error) { o.add("retry", e) }
func (o *countingObserver) OnDrop(e Event, b Bound)                            { o.add("drop:"+string(b), e) }
func (o *countingObserver) OnFinish(e Event, f Outcome)                        { o.add("finish:"+f.State.String(), e) }
func (o *countingObserver) OnModeChange(from, to Mode, reason string) {
	o.add("mode:"+to.String(), Event{})
}
func (o *countingObserver) OnCircuitChange(from, to Circuit) {
	o.add("breaker:"+to.String(), Event{})
}
func (o *countingObserver) OnLimitChange(from, to int) { o.add("limit", Event{}) }

// TestObserverSeesEveryEventOnce drives every kind of event — submissions,
// a coalesced one, a refusal, a capacity drop, a retry, a failure, a breaker
// trip, a mode switch — and checks that the observer saw each exactly as
// often as Stats counted it, with the call's label, and that Stats.Labels
// counts the live calls by label.
func TestObserverSeesEveryEventOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := newCountingObserver()
		var mu sync.Mutex
		fails := map[string]int{}
		d, _, release := holdWorker(t, func(ctx context.Context, k string, v int) error {
			mu.Lock()
			defer mu.Unlock()
			if k == "flaky" && fails[k] == 0 {
				fails[k]++
				return syscall.ECONNRESET
			}
			if k == "bad" {
				return errors.New("400")
			}
			return nil
		}, Config[string, int]{
			Capacity: 4,
			Label: func(k string, _ int) string {
				if k == holdKey {
					return "bind"
				}
				return "patch"
			},
			Retry:    RetryPolicy{InitialBackoff: time.Second, Jitter: JitterNone},
			Breaker:  &BreakerPolicy{ConsecutiveFailures: 1, Cooldown: time.Second},
			Observer: obs,
		})
		require.NoError(t, d.Post("a", 0, SubmitOptions{Droppable: true}))
		require.NoError(t, d.Post("a", 1, SubmitOptions{Droppable: true})) // coalesced
		require.NoError(t, d.Post("flaky", 0, SubmitOptions{Priority: 1}))
		require.NoError(t, d.Post("bad", 0, SubmitOptions{Priority: 1}))
		assert.ErrorIs(t, d.Post("full", 0, SubmitOptions{}), ErrBackpressure) // rejected
		require.NoError(t, d.Post("evicts", 0, SubmitOptions{Priority: 5}))    // drops "a"
		st := d.Stats()
		assert.Equal(t, map[string]int{"bind": 1, "patch": 3}, st.Labels)
		release()
		time.Sleep(10 * time.Second)
		require.NoError(t, d.SetMode(t.Context(), ModeSync))
		st = closeD(t, d)

		obs.mu.Lock()
		defer obs.mu.Unlock()
		c := obs.counts
		assert.Equal(t, int(st.Submitted-st.Rejected), c["submit"])
		assert.Equal(t, int(st.Coalesced), c["coalesced"])
		assert.Equal(t, int(st.Rejected), c["reject"])
		assert.Equal(t, int(st.Executions), c["start"])
		assert.Equal(t, int(st.Retries), c["retry"])
		assert.Equal(t, int(st.Shed[BoundCapacity]), c["drop:capacity"])
		finished := 0
		for s := StateSucceeded; s <= StateClosed; s++ {
			assert.Equal(t, int(st.Calls[s]), c["finish:"+s.String()], s.String())
			finished += int(st.Calls[s])
		}
		assert.Equal(t, 5, finished) // the held call, a (dropped), flaky, bad, evicts
		assert.Equal(t, 1, c["drop:capacity"])
		assert.Equal(t, 1, c["finish:dropped"])
		assert.Equal(t, 1, c["mode:sync"])
		assert.GreaterOrEqual(t, c["breaker:open"], 1)
		assert.Equal(t, 1, obs.labels["start:bind"])
		assert.Empty(t, st.Labels, "no live calls after Close")
	})
}

// blockingObserver blocks the first OnFinish until gate is closed; in is
// closed when that call arrives.
type blockingObserver struct {
	NopObserver
	gate chan struct{}
	once sync.Once
	in   chan struct{}
}

// OnFinish blocks the first caller until the gate opens.
func (b *blockingObserver) OnFinish(Event, Outcome) {
	first := false
	b.once.Do(func() { close(b.in); first = true })
	if first {
		<-b.gate
	}
}

// TestBlockingObserverDoesNotStallTheLock: the observer is called outside
// the dispatcher's lock, after its bookkeeping is final, so an observer
// that blocks holds up only the goroutine that called it — Stats,
// submissions and the other workers go on.
func TestBlockingObserverDoesNotStallTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &blockingObserver{gate: make(chan struct{}), in: make(chan struct{})}
		d := newD(t, nopExec, Config[string, int]{Workers: 2, Observer: obs})
		first := submit(t, d, "a", 0, SubmitOptions{})
		<-obs.in // a worker is stuck in OnFinish
		<-first.Done()
		// The lock is free: stats, submissions and the other worker go on.
		_ = d.Stats()
		var tks []*Ticket[string, int]
		for i := range 5 {
			tks = append(tks, submit(t, d, fmt.Sprint("b", i), 0, SubmitOptions{}))
		}
		waitAll(tks...) // on the other worker, while the first is still stuck
		select {
		case <-obs.gate:
			t.Fatal("gate opened early")
		default:
		}
		st := d.Stats()
		assert.Equal(t, 0, st.InFlight, "the stuck worker's bookkeeping was final before it told the observer")
		assert.Equal(t, 0, st.Keys)
		close(obs.gate)
		closeD(t, d)
	})
}

// TestObserverCountsRetryAbsorbed: a submission that waited behind its
// key's running call as a call of its own (OnSubmit told it not
// coalesced), and that the call's retry absorbs, is coalesced then:
// Stats.Coalesced counts it, and the Observer is told (OnCoalesce, with
// the successor's label), so that an Observer counting coalesced
// submissions agrees with Stats.
func TestObserverCountsRetryAbsorbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		f := newFailFirst(g, syscall.ECONNRESET)
		obs := newCountingObserver()
		d := newD(t, f.exec, Config[string, int]{
			Workers:  1,
			Retry:    noJitter(3),
			Label:    func(_ string, v int) string { return "v" + strconv.Itoa(v) },
			Observer: obs,
		})
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()
		second := submit(t, d, "k", 2, prio(1))                        // the successor
		require.NoError(t, d.Post("k", 2, SubmitOptions{Priority: 1})) // coalesced into it
		g.open()
		waitAll(first, second)
		assert.Equal(t, StateSucceeded, outcome(t, first).State)
		assert.Equal(t, int32(2), f.n.Load(), "the retry ran the successor's call")
		st := closeD(t, d)
		assert.Equal(t, uint64(2), st.Coalesced, "the Post as it joined the successor, the successor in the retry")
		obs.mu.Lock()
		defer obs.mu.Unlock()
		assert.Equal(t, int(st.Coalesced), obs.counts["coalesced"])
		assert.Equal(t, 2, obs.labels["coalesced:v2"])
	})
}

// coalesceTrap's OnCoalesce calls back into the Dispatcher, then panics
// or ends its goroutine.
type coalesceTrap struct {
	NopObserver
	d    *Dispatcher[string, int]
	exit bool
}

func (o *coalesceTrap) OnCoalesce(e Event) {
	_ = o.d.Stats()
	_ = o.d.Post("other", 1, SubmitOptions{})
	o.d.Cancel("k", errors.New("from OnCoalesce"))
	if o.exit {
		runtime.Goexit()
	}
	panic("OnCoalesce")
}

// TestOnCoalesceMisbehaves: an OnCoalesce that calls back into the
// Dispatcher (Stats, Post, Cancel of the key whose retry absorbed the
// call), then panics or ends the worker's goroutine, is contained and
// counted like any Observer method: every outcome is told, nothing stays
// live, and Close returns.
func TestOnCoalesceMisbehaves(t *testing.T) {
	for _, exit := range []bool{false, true} {
		t.Run(map[bool]string{false: "panic", true: "goexit"}[exit], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				var n atomic.Int32
				obs := &coalesceTrap{exit: exit}
				d := newD(t, func(ctx context.Context, key string, v int) error {
					if key == "k" && n.Add(1) == 1 {
						_ = g.wait(ctx)
						return syscall.ECONNRESET
					}
					return nil
				}, Config[string, int]{Workers: 1, Retry: noJitter(3), Observer: obs})
				obs.d = d
				first := submit(t, d, "k", 1, SubmitOptions{})
				synctest.Wait()
				second := submit(t, d, "k", 2, SubmitOptions{})
				g.open()
				waitAll(first, second)
				assert.Equal(t, StateCanceled, outcome(t, first).State, "OnCoalesce cancelled the retry")
				assert.Equal(t, StateCanceled, outcome(t, second).State)
				synctest.Wait()
				st := closeD(t, d)
				assert.Equal(t, uint64(1), st.CallbackPanics)
				assert.Equal(t, uint64(1), st.Calls[StateSucceeded], "other ran")
			})
		})
	}
}
