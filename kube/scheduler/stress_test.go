package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestStressOneOutcomePerAdd: many goroutines add calls of every type for
// a few objects — some no-ops, some whose Merge fails, some whose Execute
// fails with a retryable or a permanent error — while others sync objects,
// and the dispatcher is closed in the middle of it. Every Add's OnFinish
// gets exactly one value, whatever became of the call, and every value is
// one an Add can end with. Under -race this is also the adapter's test of
// its own locking.
func TestStressOneOutcomePerAdd(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := newRecorder()
	d := newTestDispatcher(t, Options{Workers: 4, Metrics: r, Retry: dispatch.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	j := &journal{}
	types := []fwk.APICallType{typeLow, typeLow, typePeer, typeHigh, typeOther}
	const (
		adders = 8
		each   = 300
	)
	chans := make([][]chan error, adders)
	// Close comes once half the calls are added and one has run: in the
	// thick of it, whatever the machine's speed.
	var added sync.WaitGroup
	added.Add(adders)
	ran := make(chan struct{})
	var ranOnce sync.Once
	var wg sync.WaitGroup
	for a := range adders {
		rng := rand.New(rand.NewPCG(seed, uint64(a)))
		wg.Go(func() {
			for i := range each {
				c := newCall(j, fmt.Sprintf("%d-%d", a, i), types[rng.IntN(len(types))], typeUID(fmt.Sprint(rng.IntN(5))), fmt.Sprint("f", rng.IntN(3)))
				switch rng.IntN(10) {
				case 0:
					c.noop = ptr(true)
				case 1:
					c.mergeErr = errTest
				case 2:
					c.exec = func(context.Context, *testCall) error { return errRetryable }
				case 3:
					c.exec = func(context.Context, *testCall) error { return errTest }
				case 4:
					c.exec = func(ctx context.Context, _ *testCall) error {
						select {
						case <-time.After(time.Millisecond):
						case <-ctx.Done():
						}
						return nil
					}
				}
				if c.exec == nil {
					c.exec = func(context.Context, *testCall) error {
						ranOnce.Do(func() { close(ran) })
						return nil
					}
				}
				ch := make(chan error, 1)
				chans[a] = append(chans[a], ch)
				_ = d.Add(c, fwk.APICallOptions{OnFinish: ch})
				if i == each/2 {
					added.Done()
				}
				if rng.IntN(4) == 0 {
					_, _ = d.SyncObject(&metav1.ObjectMeta{UID: typeUID(fmt.Sprint(rng.IntN(5))), Labels: map[string]string{"f0": ""}})
				}
			}
		})
	}
	added.Wait()
	<-ran
	d.Close(canceled())
	wg.Wait()

	// A call running when Close came gets what its Execute returned.
	allowed := []error{fwk.ErrCallSkipped, fwk.ErrCallOverwritten, errTest, errRetryable, dispatch.ErrClosed}
	counts := map[string]int{}
	for a := range adders {
		for _, ch := range chans[a] {
			var err error
			select {
			case err = <-ch:
			default:
				t.Fatal("an Add got no outcome")
			}
			requireNoMore(t, ch)
			kind := "success"
			if err != nil {
				kind = "other: " + err.Error()
				for _, target := range allowed {
					if errors.Is(err, target) {
						kind = target.Error()
						break
					}
				}
			}
			counts[kind]++
		}
	}
	t.Logf("outcomes: %v", counts)
	for kind := range counts {
		assert.NotContains(t, kind, "other: ", "an outcome an Add cannot end with")
	}
	assert.Positive(t, counts["success"])
	assert.Positive(t, counts[fwk.ErrCallOverwritten.Error()])
	assert.Positive(t, counts[fwk.ErrCallSkipped.Error()])
	s := d.Stats()
	assert.Equal(t, s.Submitted, s.Rejected+total(s.Outcomes)+uint64(s.Live), "the core's conservation")
	assert.Zero(t, s.Live)
	_, pending := r.snapshot()
	for typ, n := range pending {
		assert.Zero(t, n, "pending %s after Close", typ)
	}
	assert.NotEmpty(t, pending)
}
