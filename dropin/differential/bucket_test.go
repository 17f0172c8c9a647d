package differential

import (
	"context"
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
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	apicalls "k8s.io/kubernetes/pkg/scheduler/framework/api_calls"
)

// instant is an API server inside the test's process that answers every
// request at once with success, so that a real clientset — client-go's
// token bucket, its request path — runs in a synctest bubble, where real
// connections would not be durably blocked.
type instant struct{}

func (instant) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": []string{"application/json"}},
		Body:       io.NopCloser(strings.NewReader(`{"kind":"Status","apiVersion":"v1","status":"Success"}`)),
		Request:    r,
	}, nil
}

// TestBindingsBesidePreemption is scheduler_perf's PreemptionAsync in
// miniature, through upstream's dispatcher and the drop-in: kube-scheduler
// binds pods through the dispatcher while its async preemption deletes
// victims on the same clientset, from goroutines that each wait in
// client-go's token bucket (a DisruptionTarget patch and a delete per
// victim). The bucket serves its waiters in the order they ask, so each
// user's share of it is the waits it keeps outstanding; upstream's
// dispatcher keeps one per call. Bindings that drain slowly leave their
// pods assumed and unbound, where preemption may choose them as victims
// and delete them before they are bound: in scheduler_perf, a measured pod
// deleted so is never scheduled, and the workload never ends.
//
// 200 upstream PodBindingCalls, 12 other waiters on a bucket of 50 qps, on
// synctest's clock: the drop-in's bindings must drain no slower than 1.25
// × upstream's.
func TestBindingsBesidePreemption(t *testing.T) {
	const (
		qps      = 50
		bindings = 200
		others   = 12
	)
	run := func(t *testing.T, newDispatcher func(clientset.Interface) dispatcher) (took time.Duration, share float64) {
		synctest.Test(t, func(t *testing.T) {
			bucket := flowcontrol.NewTokenBucketRateLimiter(qps, 1)
			cs, err := clientset.NewForConfig(&rest.Config{Host: "https://apiserver.invalid", Transport: instant{}, RateLimiter: bucket})
			require.NoError(t, err)

			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var theirs atomic.Int64
			for range others { // preemption's goroutines: wait, send, again
				wg.Go(func() {
					for bucket.Wait(ctx) == nil {
						theirs.Add(1)
					}
				})
			}
			time.Sleep(time.Second) // they are queued in the bucket first

			d := newDispatcher(cs)
			d.Run(klog.Background())
			start, before := time.Now(), theirs.Load()
			done := make(chan error, bindings)
			for i := range bindings {
				name := fmt.Sprint("pod", i)
				call := apicalls.Implementations.PodBinding(&v1.Binding{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(name)},
					Target:     v1.ObjectReference{Kind: "Node", Name: "node"},
				})
				require.NoError(t, d.Add(call, fwk.APICallOptions{OnFinish: done}))
			}
			for range bindings {
				require.NoError(t, <-done)
			}
			took = time.Since(start)
			share = float64(bindings) / float64(bindings+int(theirs.Load()-before))
			d.Close()
			stop()
			wg.Wait()
		})
		return took, share
	}
	upstreamTook, upstreamShare := run(t, newUpstream)
	dropInTook, dropInShare := run(t, newDropIn)
	t.Logf("%d bindings beside %d other waiters on a bucket of %d qps: upstream's dispatcher %v (%.0f%% of the tokens), the drop-in %v (%.0f%%)",
		bindings, others, qps, upstreamTook, 100*upstreamShare, dropInTook, 100*dropInShare)
	assert.LessOrEqual(t, dropInTook, upstreamTook*5/4, "the drop-in's bindings drain as fast as upstream's beside other users of the bucket")
}
