package differential

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
)

var stressPods = flag.Int("differential.pods", 200, "pods of TestStatusPatchAsBindingStarts")

// TestStatusPatchAsBindingStarts checks, at full speed, that neither
// upstream's dispatcher nor the drop-in sends a status patch added while
// a pod's binding starts after that binding: for each pod, a binding is
// added, and status patches setting PodScheduled=False are added, one
// after another, until the binding's request reaches the server (where
// it is held until they stop). Upstream skips every one of them — the
// binding is the pod's newest call, pending and then in flight, and more
// relevant — so no status patch is ever sent after a binding. The drop-in
// must do the same; one that takes a call as in flight only once its
// Execute runs accepts a patch added in between, and sends it after the
// binding (a stale PodScheduled=False on a bound pod).
//
// It runs in real time (no bubble): the window is a race.
func TestStatusPatchAsBindingStarts(t *testing.T) {
	n := *stressPods
	count := func(t *testing.T, newDispatcher func(clientset.Interface) dispatcher) (after, tried, accepted int) {
		var ps []*v1.Pod
		for i := range n {
			ps = append(ps, pod(i, none))
		}
		srv := newServer(ps...)
		d := newDispatcher(srv.client())
		d.Run(ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1))))
		defer d.Close()
		// Pods in parallel, so that the dispatcher's goroutines and the
		// adders contend (as the scheduler's do): the window is a race.
		var wg sync.WaitGroup
		var tries, oks atomic.Int64
		for g := range stressAdders {
			wg.Go(func() {
				for i := g; i < n; i += stressAdders {
					k, ok, err := bindAsPatched(srv, d, i)
					if err != nil {
						t.Error(err)
						return
					}
					tries.Add(int64(k))
					oks.Add(int64(ok))
				}
			})
		}
		wg.Wait()
		reqs := srv.requests()
		for i := range n {
			var kinds []string
			for _, r := range reqs {
				if r.pod == podName(i) {
					kinds = append(kinds, strings.Fields(r.what)[0])
				}
			}
			if b := slices.Index(kinds, "bind"); b >= 0 && slices.Contains(kinds[b+1:], "patch") {
				after++
			}
		}
		return after, int(tries.Load()), int(oks.Load())
	}
	theirs, theirsTried, theirsAccepted := count(t, newUpstream)
	ours, oursTried, oursAccepted := count(t, newDropIn)
	t.Logf("pods with a status patch sent after their binding, of %d: upstream %d, drop-in %d (status patches added as the bindings started: %d, %d; accepted: %d, %d)",
		n, theirs, ours, theirsTried, oursTried, theirsAccepted, oursAccepted)
	assert.Zero(t, theirs, "upstream")
	assert.Equal(t, theirs, ours, "the drop-in sent a status patch after the binding, for %d of %d pods", ours, n)
}

// stressAdders is how many goroutines add calls at once.
const stressAdders = 8

// bindAsPatched adds pod i's binding, held at the server, and status
// patches until the binding's request is there; then lets the binding
// through and waits for every call it accepted. It returns how many
// status patches were added, and how many accepted.
func bindAsPatched(srv *server, d dispatcher, i int) (tried, accepted int, err error) {
	p := podName(i)
	srv.hold(p)
	bound := make(chan error, 1)
	if err := d.Add(bind(i, "node-1").build(0, nil), fwk.APICallOptions{OnFinish: bound}); err != nil {
		return 0, 0, fmt.Errorf("%s's binding: %w", p, err)
	}
	var patches []chan error
	deadline := time.Now().Add(30 * time.Second)
	for !srv.isHeld(p) {
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("%s's binding did not reach the server within 30s", p)
		}
		tried++
		ch := make(chan error, 2)
		if d.Add(patch(i, none, unschedulable).build(0, nil), fwk.APICallOptions{OnFinish: ch}) == nil {
			patches = append(patches, ch)
		}
	}
	if _, ok := srv.release(p, nil); !ok {
		return 0, 0, fmt.Errorf("%s's binding was not held", p)
	}
	for _, ch := range append([]chan error{bound}, patches...) {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			return 0, 0, fmt.Errorf("%s: a call accepted did not finish within 30s", p)
		}
	}
	return tried, len(patches), nil
}
