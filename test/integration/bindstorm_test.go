package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// testBindStorm is scenario 1, kubernetes#135900 against a real server: 200
// bindings submitted one every 25ms during a storm of 2000 status patches
// (five rounds over 400 other pods, the first queued before any binding),
// through the preset with kube-scheduler's client limits — 50 qps, burst
// 100 — enforced by the dispatcher, the clientset having no bucket of its
// own.
//
// It proves, from what reached the server:
//   - every binding landed (spec.nodeName read back) and no pod was bound
//     twice: exactly one binding request per pod, answered 201;
//   - the patches coalesced: fewer status writes than submissions, and
//     every pod's status is its newest patch;
//   - no binding was overtaken: no status patch started between a
//     binding's submission and its start, but those already executing
//     when it was submitted (the dispatcher's observer);
//   - the bindings were all done before the patch backlog drained.
//
// It logs bind latency (submission to outcome) and the patch figures in one
// line, quoted in the README.
func testBindStorm(t *testing.T, s *apiserver.Server) {
	const (
		binds     = 200
		stormPods = 400
		rounds    = 5 // status patches per storm pod
		bindEvery = 25 * time.Millisecond
		node      = "node-storm"
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(t, s.AdminClient, "storm")
	storm := createPods(t, s.AdminClient, ns, "storm", stormPods)
	bound := createPods(t, s.AdminClient, ns, "bind", binds)
	// The scheduler builds its calls from its informer's view, which the
	// patches that land keep fresh; the informer uses the admin client, so
	// the proxy sees only the dispatcher's requests.
	pods := podLister(t, s.AdminClient, ns)
	view := func(p *corev1.Pod) *corev1.Pod {
		got, err := pods.Get(p.Name)
		require.NoError(t, err)
		return got
	}
	starts := &patchStarts{}
	d := newDispatcher(t, s.Config, kube.Options{Observer: starts})

	post := func(i int) { // the i-th status patch of the storm
		p := storm[i%stormPods]
		msg := fmt.Sprintf("0/100 nodes are available (round %d)", i/stormPods)
		require.NoError(t, d.Post(kube.PatchStatus(view(p), kube.StatusPatch{Conditions: []corev1.PodCondition{unschedulable(msg)}}), kube.SubmitOptions{}))
	}
	type bindTimes struct {
		submitted, queued, done time.Time
		patchesInFlight         int // when it was queued
		res                     kube.Result
		err                     error
	}
	runs := make([]bindTimes, binds)
	var wg sync.WaitGroup
	defer func() { // on a failure, stop waiting for the bindings
		cancel()
		wg.Wait()
	}()

	start := time.Now()
	for i := range stormPods {
		post(i)
	}
	next := stormPods
	perBind := stormPods * (rounds - 1) / binds
	for i, p := range bound {
		time.Sleep(time.Until(start.Add(time.Duration(i) * bindEvery)))
		for range perBind {
			post(next)
			next++
		}
		r := &runs[i]
		r.submitted = time.Now()
		tk, err := d.Submit(ctx, kube.Bind(view(p), node), kube.SubmitOptions{})
		require.NoError(t, err)
		// Once Submit has returned the binding is queued: from now on a
		// status patch may start only if it was executing already.
		r.patchesInFlight = d.Stats().Tenants[string(kube.PodStatusPatch)].InFlight
		r.queued = time.Now()
		wg.Go(func() {
			r.res, r.err = tk.Wait(ctx)
			r.done = time.Now()
		})
	}
	require.Equal(t, stormPods*rounds, next)
	wg.Wait()
	var lastBind time.Time
	latency := make([]time.Duration, binds)
	for i, r := range runs {
		require.NoError(t, r.err, "binding %d", i)
		require.Equal(t, dispatch.StateSucceeded, r.res.State, "binding %d: %v", i, r.res.Err)
		latency[i] = r.done.Sub(r.submitted)
		lastBind = later(lastBind, r.done)
	}
	// Close drains the patch backlog.
	require.NoError(t, d.Close(ctx), "the patch backlog did not drain")
	st := d.Stats()
	assert.Equal(t, uint64(0), st.Outcomes[dispatch.StateFailed], "failed submissions")

	reqs := s.Proxy.Filter(inNamespace(ns))
	bindReq := map[string][]apiserver.Request{}
	var writes, conflicts, others int
	var lastWrite time.Time
	for _, r := range reqs {
		switch {
		case isBinding(r):
			bindReq[r.Name] = append(bindReq[r.Name], r)
		case isStatusPatch(r) && r.Status == http.StatusOK:
			writes++
			lastWrite = later(lastWrite, r.Received)
		case isStatusPatch(r) && r.Status == http.StatusConflict:
			conflicts++
		case r.IsWrite():
			others++
		}
	}
	assert.Zero(t, others, "unexpected writes")

	// Every binding landed, once.
	for _, p := range bound {
		got := bindReq[p.Name]
		if assert.Len(t, got, 1, "binding requests for %s: %v", p.Name, statuses(got)) {
			assert.Equal(t, http.StatusCreated, got[0].Status, "binding of %s", p.Name)
		}
	}
	onServer, err := s.AdminClient.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	byName := map[string]*corev1.Pod{}
	for i := range onServer.Items {
		byName[onServer.Items[i].Name] = &onServer.Items[i]
	}
	for _, p := range bound {
		assert.Equal(t, node, byName[p.Name].Spec.NodeName, "pod %s", p.Name)
	}
	// The patches coalesced, and the newest of each pod's won.
	newest := fmt.Sprintf("0/100 nodes are available (round %d)", rounds-1)
	for _, p := range storm {
		c := condition(byName[p.Name], corev1.PodScheduled)
		if assert.NotNil(t, c, "pod %s has no PodScheduled", p.Name) {
			assert.Equal(t, newest, c.Message, "pod %s", p.Name)
		}
	}
	assert.GreaterOrEqual(t, writes, stormPods, "every storm pod written")
	assert.Less(t, writes, stormPods*rounds/2, "status writes: the patches hardly coalesced")

	// No binding overtaken by a patch. A binding started when the
	// dispatcher chose it, QueueWait after it was queued (by the
	// dispatcher's clock, read as it chose: never later than submitted +
	// QueueWait). A patch starts after it is chosen, so one whose start the
	// observer saw between the binding's queueing and the binding's start
	// was chosen before the binding: legitimately only if it was executing
	// already when the binding was queued.
	patchStarted := starts.times()
	overtaken, worst := 0, 0
	var bindWait, bindRun []time.Duration
	for i, p := range bound {
		r := runs[i]
		bindWait = append(bindWait, r.res.QueueWait)
		bindRun = append(bindRun, r.res.RunTime)
		chosen := r.submitted.Add(r.res.QueueWait)
		n := 0
		for _, at := range patchStarted {
			if at.After(r.queued) && at.Before(chosen) {
				n++
			}
		}
		worst = max(worst, n)
		if n > r.patchesInFlight {
			overtaken++
			t.Errorf("binding %d (%s): %d status patches started after it was queued and before it started (+%v), %d were executing",
				i, p.Name, n, r.res.QueueWait, r.patchesInFlight)
		}
	}
	// Binds first: the backlog outlived them.
	assert.True(t, lastBind.Before(lastWrite), "last binding done at +%v, after the last status write at +%v",
		lastBind.Sub(start), lastWrite.Sub(start))

	slices.Sort(latency)
	t.Logf("scenario 1: %d binds p50 %v p99 %v (submit → outcome; dispatcher 50 qps / burst 100, %d workers); "+
		"%d status-patch submissions for %d pods → %d status writes (%d conflicts); "+
		"binds overtaken by an earlier patch: %d; last bind done at +%v, last status write at +%v",
		binds, quantile(latency, 0.50), quantile(latency, 0.99), 16, // the preset's workers
		stormPods*rounds, stormPods, writes, conflicts,
		overtaken, lastBind.Sub(start).Round(10*time.Millisecond), lastWrite.Sub(start).Round(10*time.Millisecond))
	slices.Sort(bindWait)
	slices.Sort(bindRun)
	t.Logf("scenario 1 details: bind queue wait p50 %v p99 %v, bind request p50 %v p99 %v; dispatcher: %d executions, %d retries, %d submissions coalesced; "+
		"at most %d patches started while a binding was queued, all executing when it was",
		quantile(bindWait, 0.5), quantile(bindWait, 0.99), quantile(bindRun, 0.5), quantile(bindRun, 0.99),
		st.Executions, st.Retries, st.Coalesced, worst)
}

// patchStarts is an observer that records when each status-patch
// execution starts: just after the worker chose the call.
type patchStarts struct {
	dispatch.NopObserver
	mu sync.Mutex
	at []time.Time
}

func (o *patchStarts) OnStart(e dispatch.Event, _ int, _ time.Duration) {
	if e.Label != string(kube.PodStatusPatch) {
		return
	}
	now := time.Now()
	o.mu.Lock()
	o.at = append(o.at, now)
	o.mu.Unlock()
}

func (o *patchStarts) times() []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.at)
}

// podLister starts an informer on the pods of ns and returns its lister,
// once it has synced. The informer stops when the test ends.
func podLister(t *testing.T, c kubernetes.Interface, ns string) corelisters.PodNamespaceLister {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	lister := f.Core().V1().Pods().Lister()
	stop := make(chan struct{})
	f.Start(stop)
	t.Cleanup(func() {
		close(stop)
		f.Shutdown()
	})
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		require.True(t, ok, "informer for %v did not sync", typ)
	}
	return lister.Pods(ns)
}

// quantile returns the q-quantile of sorted ds (nearest rank), rounded to
// the millisecond.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)].Round(time.Millisecond)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
