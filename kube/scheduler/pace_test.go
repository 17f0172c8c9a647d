package scheduler

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	fwk "k8s.io/kube-scheduler/framework"
)

// paceServer stands in for the API server in the pacing tests: status
// patches whose Execute takes the server's current latency, and the
// figures the tests read — how many ran at once, when the last ended.
type paceServer struct {
	latency atomic.Int64 // ns

	mu       sync.Mutex
	now      int
	peak     int
	done     int
	lastDone time.Time
}

func (s *paceServer) exec(context.Context, *testCall) error {
	s.mu.Lock()
	s.now++
	s.peak = max(s.peak, s.now)
	s.mu.Unlock()
	time.Sleep(time.Duration(s.latency.Load()))
	s.mu.Lock()
	s.now--
	s.done++
	s.lastDone = time.Now()
	s.mu.Unlock()
	return nil
}

// storm adds n status patches for fresh pods and returns when they have
// all ended.
func (s *paceServer) storm(t *testing.T, d *Dispatcher, from, n int) {
	t.Helper()
	done := make(chan error, n)
	for i := range n {
		c := newCall(&journal{}, fmt.Sprint("patch", from+i), podStatusPatch, types.UID(fmt.Sprint("pod", from+i)), "PodScheduled")
		c.exec = s.exec
		require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: done}))
	}
	for range n {
		require.NoError(t, <-done)
	}
}

// pacedDispatcher returns a started dispatcher on a clientset at qps and
// burst (its requests never sent: the test's calls do not use it), with
// PaceStatusPatches unless capped is positive, in which case a constant
// cap of capped status patches in flight instead.
func pacedDispatcher(t *testing.T, qps float32, burst, capped int) *Dispatcher {
	t.Helper()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", QPS: qps, Burst: burst})
	require.NoError(t, err)
	o := Options{PaceStatusPatches: true}
	if capped > 0 {
		o = Options{Tenants: map[fwk.APICallType]dispatch.TenantConfig{podStatusPatch: {MaxInFlight: capped}}}
	}
	d, err := New(cs, fwk.APICallRelevances{podStatusPatch: 1, podBinding: 2}, o)
	require.NoError(t, err)
	require.True(t, d.wire.metered, d.wire.why)
	d.Start(testLogger(t))
	return d
}

// TestPaceStatusPatches: paced, a storm of status patches drains at the
// client's rate — within 10% of the time its token bucket alone allows,
// (patches − burst) ÷ qps, as with upstream's goroutine per call — whether
// the server answers in 10 ms or in 100, or slows from one to the other
// mid-storm; and no more patches run at once than twice that rate needs
// at the latency seen (Little's law): 1 at 10 ms, 10 at 100 ms. A
// constant cap of two, at 100 ms, carries only 20 patches a second: the
// storm takes 2.5 times as long.
func TestPaceStatusPatches(t *testing.T) {
	const (
		qps     = 50
		burst   = 100
		patches = 400
	)
	bucketAlone := time.Duration(float64(patches-burst) / qps * float64(time.Second))
	for _, tc := range []struct {
		name           string
		first, then    time.Duration // the server's latency, for the first half and the second
		capped         int           // a constant cap instead of pacing
		wantCap        int
		wantPeak       int
		slowerThanRate bool
	}{
		{name: "fast server", first: 10 * time.Millisecond, then: 10 * time.Millisecond, wantCap: 1, wantPeak: 1},
		{name: "slow server", first: 100 * time.Millisecond, then: 100 * time.Millisecond, wantCap: 10, wantPeak: 10},
		{name: "server slows mid-storm", first: 10 * time.Millisecond, then: 100 * time.Millisecond, wantCap: 10, wantPeak: 10},
		{name: "constant cap of two, slow server", first: 100 * time.Millisecond, then: 100 * time.Millisecond, capped: 2, wantPeak: 2, slowerThanRate: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := pacedDispatcher(t, qps, burst, tc.capped)
				defer d.Close(canceled())
				s := &paceServer{}
				start := time.Now()
				s.latency.Store(int64(tc.first))
				s.storm(t, d, 0, patches/2)
				s.latency.Store(int64(tc.then))
				s.storm(t, d, patches/2, patches/2)
				took := s.lastDone.Sub(start)
				t.Logf("%d patches in %v (the bucket alone: %v); at most %d at once", patches, took, bucketAlone, s.peak)
				if tc.slowerThanRate {
					assert.Greater(t, took, bucketAlone*2, "a constant cap falls behind the rate")
				} else {
					assert.LessOrEqual(t, took, bucketAlone*11/10, "the storm drains at the client's rate")
					assert.Equal(t, tc.wantCap, d.pace.current())
				}
				assert.LessOrEqual(t, s.peak, tc.wantPeak)
			})
		})
	}
}

// TestPacerCap: the cap is paceHeadroom × qps × the moving average of
// execution times, rounded up, at least 1 and at most the workers not
// reserved, and the core is told only when it changes.
func TestPacerCap(t *testing.T) {
	var sets []int
	p := newPacer(50, 16, 4, func(n int) error { sets = append(sets, n); return nil })
	require.NotNil(t, p)
	p.observe(7 * time.Millisecond) // 2 × 50 × 0.007 = 0.7: 1
	p.observe(7 * time.Millisecond)
	assert.Equal(t, 1, p.current())
	p.observe(207 * time.Millisecond) // average 7 + 200/8 = 32 ms: 3.2, 4
	assert.Equal(t, 4, p.current())
	p.observe(time.Hour) // beyond the workers not reserved: 12
	assert.Equal(t, 12, p.current())
	p.observe(-time.Second) // a clock step: counts as 0
	assert.Equal(t, []int{1, 4, 12}, sets, "set at the start and at each change only")
	assert.Nil(t, newPacer(0, 16, 4, nil), "no rate to follow")
	assert.Nil(t, newPacer(-1, 16, 4, nil))
	q := newPacer(50, 1, 0, func(int) error { return nil })
	q.observe(time.Hour)
	assert.Equal(t, 1, q.current(), "at least one worker")
}

// TestPaceStatusPatchesOptions: pacing and a constant cap of the status
// patches' tenant are refused together, naming the fields; with a client
// that has no bucket the adapter can take tokens from (a fake), pacing is
// off and the status patches are not capped.
func TestPaceStatusPatchesOptions(t *testing.T) {
	_, err := New(fake.NewClientset(), testRelevances, Options{
		PaceStatusPatches: true,
		Tenants:           map[fwk.APICallType]dispatch.TenantConfig{podStatusPatch: {MaxInFlight: 2}},
	})
	require.ErrorContains(t, err, "Options.PaceStatusPatches true and Tenants[pod_status_patch].MaxInFlight 2 both cap the status patches in flight: set one")
	d := newIdleDispatcher(t, Options{PaceStatusPatches: true})
	assert.Nil(t, d.pace)
}

// TestPaceStatusPatchesUnlimitedClient: a client built without a rate
// limiter (rest.Config.QPS negative: client-go makes no bucket) has no
// rate to follow, so PaceStatusPatches leaves the status patches uncapped,
// as with a client the adapter cannot unwrap; New does not fail, nor
// panic, and the patches run.
func TestPaceStatusPatchesUnlimitedClient(t *testing.T) {
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", QPS: -1})
	require.NoError(t, err)
	d, err := New(cs, fwk.APICallRelevances{podStatusPatch: 1, podBinding: 2}, Options{PaceStatusPatches: true})
	require.NoError(t, err)
	defer d.Close(canceled())
	assert.Nil(t, d.pace, "no bucket: no rate to pace at")
	d.Start(testLogger(t))
	done := make(chan error, 1)
	require.NoError(t, d.Add(newCall(&journal{}, "patch", podStatusPatch, "pod", "PodScheduled"), fwk.APICallOptions{OnFinish: done}))
	require.NoError(t, outcome(t, done))
}

// TestPacerZeroLatency: an execution time of 0 (a server that answers
// within the clock's resolution) is an observation like any other, each
// weighing 1/8 in the average: a slow patch after fast ones moves the cap
// by its share, not to its own latency alone.
func TestPacerZeroLatency(t *testing.T) {
	p := newPacer(50, 16, 4, func(int) error { return nil })
	require.NotNil(t, p)
	p.observe(0)
	p.observe(0)
	assert.Equal(t, 1, p.current())
	p.observe(80 * time.Millisecond) // average 0 + 80/8 = 10 ms: 2 × 50 × 0.01 = 1
	assert.Equal(t, 1, p.current(), "the slow patch weighs 1/8")
}
