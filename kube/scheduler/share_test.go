package scheduler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	fwk "k8s.io/kube-scheduler/framework"
)

// instantServer is an API server inside the test's process: every request
// succeeds at once, and is counted. It lets a clientset run in a synctest
// bubble, where real connections would not be durably blocked.
type instantServer struct{ requests atomic.Int64 }

func (s *instantServer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	s.requests.Add(1)
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": []string{"application/json"}},
		Body:       io.NopCloser(strings.NewReader(`{"kind":"Status","apiVersion":"v1","status":"Success"}`)),
		Request:    r,
	}, nil
}

// TestShareOfTheBucket is kube-scheduler's async preemption beside the
// dispatcher: the preemption executor deletes victims on the scheduler's
// own clientset (fh.ClientSet()), from goroutines that each wait in
// client-go's token bucket, while the dispatcher's bindings wait there
// too. client-go's bucket serves its waiters in the order they ask, so a
// user's share of it is the number of waits it keeps outstanding. Upstream's
// dispatcher, a goroutine per call, keeps one per call; the adapter must
// keep as many as it has calls waiting, or a binding waits for a turn
// among every other waiter — with twelve of them, a thirteenth of the
// bucket — and the pods it binds sit
// assumed, unbound, for as long as the bindings take: long enough, in
// scheduler_perf's PreemptionAsync, for the churn's preemptors to choose
// them as victims and delete them before they are bound.
//
// 200 bindings, 16 workers, 12 other waiters on a bucket of 50 qps: the
// bindings must drain no slower than 1.25 × upstream's dispatcher drains
// them, in the same bubble (on synctest's clock, so the figures are the
// model's).
func TestShareOfTheBucket(t *testing.T) {
	const (
		qps      = 50
		bindings = 200
		others   = 12
		workers  = 16
	)
	run := func(t *testing.T, bind func(kubernetes.Interface, []fwk.APICall)) (took time.Duration, share float64) {
		synctest.Test(t, func(t *testing.T) {
			bucket := flowcontrol.NewTokenBucketRateLimiter(qps, 1)
			srv := &instantServer{}
			cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://apiserver.invalid", Transport: srv, RateLimiter: bucket})
			require.NoError(t, err)

			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var theirs atomic.Int64
			for range others { // the executor's goroutines: wait, send, again
				wg.Go(func() {
					for bucket.Wait(ctx) == nil {
						theirs.Add(1)
					}
				})
			}
			time.Sleep(time.Second) // they are queued in the bucket first
			start, before := time.Now(), theirs.Load()
			var calls []fwk.APICall
			for i := range bindings {
				calls = append(calls, &restCall{typ: podBinding, pod: fmt.Sprint("pod", i)})
			}
			bind(cs, calls)
			took = time.Since(start)
			got := theirs.Load() - before
			share = float64(bindings) / float64(bindings+int(got))
			stop()
			wg.Wait()
		})
		return took, share
	}

	upstreamTook, upstreamShare := run(t, func(cs kubernetes.Interface, calls []fwk.APICall) {
		upstreamLike(cs, calls)() // a goroutine per call, as upstream's dispatcher runs them
	})
	took, share := run(t, func(cs kubernetes.Interface, calls []fwk.APICall) {
		d, err := New(cs, fwk.APICallRelevances{podStatusPatch: 1, podBinding: 2}, Options{Workers: workers})
		require.NoError(t, err)
		require.True(t, d.wire.metered, d.wire.why)
		d.Start(testLogger(t))
		defer d.Close(canceled())
		done := make(chan error, len(calls))
		for _, c := range calls {
			require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: done}))
		}
		for range calls {
			require.NoError(t, <-done)
		}
	})
	t.Logf("%d bindings beside %d other waiters: upstream's dispatcher %v (%.0f%% of the tokens), the adapter %v (%.0f%%)",
		bindings, others, upstreamTook, 100*upstreamShare, took, 100*share)
	assert.LessOrEqual(t, took, upstreamTook*5/4, "the adapter's bindings drain as fast as upstream's beside other users of the bucket")
}

// heldBucket is a flowcontrol.RateLimiter whose Wait blocks until the test
// grants it (or its context ends), and which counts the waits outstanding.
type heldBucket struct {
	flowcontrol.RateLimiter // QPS, for the pacer; nothing else is called
	grant                   chan error
	now, peak               atomic.Int64
}

func (b *heldBucket) Wait(ctx context.Context) error {
	n := b.now.Add(1)
	defer b.now.Add(-1)
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
	select {
	case err := <-b.grant:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestGateShares: the gate keeps a wait on the bucket for each call
// waiting, and one more for each call added while the core waits, never
// more than its shares, at least one for each caller of Wait; hands each
// wait's error to a caller; banks the tokens granted while nobody asks,
// for the next callers; makes its waits through goroutines it keeps, parked
// between waits; and Close ends the waits it left outstanding and its
// goroutines (goleak would see one left behind).
func TestGateShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &heldBucket{RateLimiter: flowcontrol.NewFakeAlwaysRateLimiter(), grant: make(chan error)}
		var demand atomic.Int64
		g := newGate()
		g.l, g.shares, g.demand = b, 4, func() int { return int(demand.Load()) }
		g.added() // before Start: nothing
		g.open()

		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		wait := func() {
			go func() { got <- g.Wait(ctx) }()
			synctest.Wait()
		}
		grant := func(err error) {
			b.grant <- err
			synctest.Wait()
		}
		demand.Store(2)
		wait()
		assert.EqualValues(t, 2, b.now.Load(), "a wait for each call waiting")
		g.added()
		synctest.Wait()
		assert.EqualValues(t, 3, b.now.Load(), "and one for a call added while the core waits")
		grant(nil)
		require.NoError(t, <-got)
		assert.EqualValues(t, 2, b.now.Load(), "the other waits go on")
		g.added()
		synctest.Wait()
		assert.EqualValues(t, 2, b.now.Load(), "nobody waits for a token: no wait for a call added")

		demand.Store(100)
		wait()
		assert.EqualValues(t, 4, b.now.Load(), "no more waits than shares")
		grant(errors.New("bucket broken"))
		assert.EqualError(t, <-got, "bucket broken")
		assert.EqualValues(t, 3, b.now.Load())

		// Nobody asks: the three tokens granted now are banked.
		grant(nil)
		grant(nil)
		grant(nil)
		assert.EqualValues(t, 0, b.now.Load())
		demand.Store(0)
		for range 3 {
			wait()
			require.NoError(t, <-got, "a banked token is handed out at once")
		}
		assert.EqualValues(t, 0, b.now.Load(), "and takes no wait")
		assert.EqualValues(t, 4, b.peak.Load())

		wait() // a caller with no call counted still gets a wait of its own
		assert.EqualValues(t, 1, b.now.Load())
		g.mu.Lock()
		waiters := g.waiters
		g.mu.Unlock()
		assert.Equal(t, 4, waiters, "the waits were made by the waiters parked since, no goroutine per wait")
		g.close()
		assert.EqualValues(t, 0, b.now.Load(), "Close ended the waits")
		select {
		case err := <-got:
			t.Fatalf("Wait returned %v after Close", err)
		default:
		}
		cancel()
		assert.ErrorIs(t, <-got, context.Canceled, "a caller left waiting ends with its context")
	})
}

// TestPacedPatchesKeepNoWaits: status patches held back by the pacer's cap
// keep no waits on the client's bucket, so that its other users — the
// scheduler's own deletions of preemption victims, on the same clientset —
// wait behind the few patches that may run, not behind every one queued.
// With 400 patches queued on a bucket of 50 qps, a deletion asked for
// meanwhile waits a few tokens (a wait each for the patches the cap lets
// run and for the bindings), where a wait per queued patch put it 8 s (400
// tokens) behind them.
func TestPacedPatchesKeepNoWaits(t *testing.T) {
	const (
		qps     = 50
		patches = 400
	)
	synctest.Test(t, func(t *testing.T) {
		bucket := flowcontrol.NewTokenBucketRateLimiter(qps, 1)
		cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://apiserver.invalid", Transport: &instantServer{}, RateLimiter: bucket})
		require.NoError(t, err)
		d, err := New(cs, fwk.APICallRelevances{podStatusPatch: 1, podBinding: 2}, Options{PaceStatusPatches: true})
		require.NoError(t, err)
		require.True(t, d.wire.metered, d.wire.why)
		require.NotNil(t, d.pace)
		d.Start(testLogger(t))
		defer d.Close(canceled())
		done := make(chan error, patches+1)
		begin := time.Now()
		for i := range patches {
			require.NoError(t, d.Add(&restCall{typ: podStatusPatch, pod: fmt.Sprint("pod", i)}, fwk.APICallOptions{OnFinish: done}))
		}
		time.Sleep(time.Second) // the patches are under way, and their waits made
		start := time.Now()
		require.NoError(t, bucket.Wait(context.Background())) // a victim's deletion
		waited := time.Since(start)
		require.NoError(t, d.Add(&restCall{typ: podBinding, pod: "preemptor"}, fwk.APICallOptions{OnFinish: done}))
		for range patches + 1 {
			require.NoError(t, <-done)
		}
		drained := time.Since(begin)
		t.Logf("a deletion asked for behind %d queued patches (pacer's cap %d) waited %v; the patches drained in %v", patches, d.pace.current(), waited, drained)
		assert.LessOrEqual(t, waited, 10*time.Second/qps, "the deletion waits at most ten tokens")
		// At the bucket's rate: a token for each patch, the deletion and the
		// binding, and two of slack.
		assert.LessOrEqual(t, drained, (patches+4)*time.Second/qps, "the patches keep the bucket's rate")
	})
}

// TestGateAllow: the core tries the gate's Allow before its goroutine waits
// on it. With no bucket to take from (a fake or wrapped client), Allow
// grants every token once the gate is open, and none before, so nothing
// runs before Start; with a bucket, it never grants, and every token comes
// from a wait on the bucket.
func TestGateAllow(t *testing.T) {
	g := newGate()
	assert.False(t, g.Allow(), "before Start")
	g.open()
	for range 3 {
		assert.True(t, g.Allow(), "open, no bucket: every token")
	}

	b := newGate()
	b.l = flowcontrol.NewFakeAlwaysRateLimiter()
	b.open()
	assert.False(t, b.Allow(), "a bucket's tokens are waited for")
	b.close()
}
