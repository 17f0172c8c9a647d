// Command scheduler is a scheduler-shaped program on the kube preset: a
// serial scheduling loop places pods on nodes, hands each binding to the
// dispatcher and goes on at once, as kube-scheduler's binding cycle does;
// pods that fit nowhere get PodScheduled=False, posted without waiting; a
// binding that fails puts the pod's place back and reports the failure.
//
// It runs against the fake clientset, with API latency and a few faults
// injected — a 503 on some bindings, a response lost after the binding
// landed, a pod another scheduler bound first — and prints a summary:
//
//	go run ./kube/examples/scheduler
//	go run ./kube/examples/scheduler -pods 1000 -nodes 40 -qps 500 -latency 0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// config is the cluster and the API the program simulates.
type config struct {
	pods, nodes, perNode int
	latency              time.Duration
	qps                  float64
}

func main() {
	var c config
	flag.IntVar(&c.pods, "pods", 300, "pods to schedule")
	flag.IntVar(&c.nodes, "nodes", 10, "nodes")
	flag.IntVar(&c.perNode, "per-node", 25, "pods a node fits")
	flag.DurationVar(&c.latency, "latency", time.Millisecond, "API latency per request")
	flag.Float64Var(&c.qps, "qps", 200, "API requests per second the dispatcher allows (negative: no limit)")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, c); err != nil {
		log.Fatal(err)
	}
}

// scheduler is the plugin's state: free places per node, and the outcomes
// of the binding cycles.
type scheduler struct {
	d    *kube.Dispatcher
	mu   sync.Mutex
	free map[string]int

	bound, failed, unschedulable int
	failures                     []string
}

func run(ctx context.Context, w io.Writer, c config) error {
	if c.pods < 1 || c.nodes < 1 || c.perNode < 1 || c.latency < 0 {
		return fmt.Errorf("scheduler: -pods, -nodes and -per-node must be positive and -latency not negative")
	}
	api := newAPI(c)
	d, err := kube.NewDispatcher(api.cs, kube.Options{
		QPS:     c.qps,
		Workers: 8,
		Retry:   dispatch.RetryPolicy{InitialBackoff: 10 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	s := &scheduler{d: d, free: map[string]int{}}
	for i := range c.nodes {
		s.free[nodeName(i)] = c.perNode
	}
	start := time.Now()
	s.schedule(ctx, api, c)
	if err := d.Close(ctx); err != nil { // drains the status patches
		return err
	}
	s.summary(w, api, c, time.Since(start))
	return nil
}

// schedule is the serial scheduling loop. Every write to a pod — its
// binding, its PodScheduled=False — is a kube.Call keyed by the pod's UID,
// so a pod's writes run in order on one lane while other pods' run beside
// them. The loop waits for none of them: a binding's outcome is the
// binding cycle's, on a goroutine of its own.
func (s *scheduler) schedule(ctx context.Context, api *api, c config) {
	var bindings sync.WaitGroup
	for i := range c.pods {
		pod := api.pod(podName(i))
		node := s.pick()
		if node == "" {
			s.reportUnschedulable(pod, fmt.Sprintf("0/%d nodes are available: %d Insufficient pods.", c.nodes, c.nodes))
			continue
		}
		// The scheduling cycle ends here; the binding cycle goes on
		// beside it.
		t, err := s.d.Submit(ctx, kube.Bind(pod, node), kube.SubmitOptions{Generation: attempt})
		if err != nil {
			s.unreserve(pod, node, err)
			continue
		}
		bindings.Go(func() { s.bindingCycle(ctx, pod, node, t) })
	}
	bindings.Wait()
}

// summary prints the outcomes, the requests the API served and the
// dispatcher's own figures.
func (s *scheduler) summary(w io.Writer, api *api, c config, took time.Duration) {
	st := s.d.Stats()
	fmt.Fprintf(w, "scheduled %d pods on %d nodes in %v\n", c.pods, c.nodes, took.Round(time.Millisecond))
	fmt.Fprintf(w, "  bound:          %d\n", s.bound)
	fmt.Fprintf(w, "  unschedulable:  %d (PodScheduled=False reported)\n", s.unschedulable)
	fmt.Fprintf(w, "  bind failed:    %d\n", s.failed)
	for _, f := range s.failures {
		fmt.Fprintf(w, "    %s\n", f)
	}
	fmt.Fprintf(w, "  API requests:   %d bindings, %d status patches, %d reads\n",
		api.count("create"), api.count("patch"), api.count("get"))
	fmt.Fprintf(w, "  dispatcher:     %d retries, %d found done by reading back, %d calls failed\n",
		st.Retries, st.AlreadyDone, st.Calls[dispatch.StateFailed])
}

// pick reserves a place on the node with the most room, or returns "".
func (s *scheduler) pick() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	best := ""
	for n, free := range s.free {
		if free > 0 && (best == "" || free > s.free[best] || free == s.free[best] && n < best) {
			best = n
		}
	}
	if best != "" {
		s.free[best]--
	}
	return best
}

// bindingCycle waits for the binding's outcome, as kube-scheduler's binding
// goroutine does.
func (s *scheduler) bindingCycle(ctx context.Context, pod *v1.Pod, node string, t *kube.Ticket) {
	if _, err := t.Wait(ctx); err != nil {
		s.unreserve(pod, node, err)
		return
	}
	s.mu.Lock()
	s.bound++
	s.mu.Unlock()
}

// unreserve gives the node's place back and reports the failure on the pod.
func (s *scheduler) unreserve(pod *v1.Pod, node string, err error) {
	s.mu.Lock()
	s.free[node]++
	s.failed++
	s.failures = append(s.failures, fmt.Sprintf("%s on %s: %v", pod.Name, node, errors.Unwrap(err)))
	s.mu.Unlock()
	s.report(pod, v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: "SchedulerError", Message: err.Error()})
}

func (s *scheduler) reportUnschedulable(pod *v1.Pod, msg string) {
	s.mu.Lock()
	s.unschedulable++
	s.mu.Unlock()
	s.report(pod, v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: msg})
}

// attempt is the scheduling attempt every pod is in: each is scheduled
// once. Every write of one attempt carries it as its Generation, so that a
// later attempt's writes would supersede this one's, and this one's be
// refused (dispatch.ErrStale) while a later one's is queued or in flight.
const attempt = 1

// report posts a status patch and does not wait for it.
func (s *scheduler) report(pod *v1.Pod, cond v1.PodCondition) {
	if err := s.d.Post(kube.PatchStatus(pod, kube.StatusPatch{Conditions: []v1.PodCondition{cond}}), kube.SubmitOptions{Generation: attempt}); err != nil {
		log.Printf("reporting %s: %v", pod.Name, err)
	}
}

func podName(i int) string  { return fmt.Sprintf("web-%d", i) }
func nodeName(i int) string { return fmt.Sprintf("node-%02d", i) }

// api is the fake clientset with kube-apiserver's binding semantics,
// latency and faults.
type api struct {
	cs      *fake.Clientset
	latency time.Duration
	mu      sync.Mutex
	n       map[string]int // requests by verb
}

var podsGVR = v1.SchemeGroupVersion.WithResource("pods")

func newAPI(c config) *api {
	a := &api{cs: fake.NewClientset(), latency: c.latency, n: map[string]int{}}
	for i := range c.pods {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: podName(i), UID: types.UID(fmt.Sprintf("uid-%d", i)), ResourceVersion: "1"}}
		if i == 7 {
			p.Spec.NodeName = "node-elsewhere" // another scheduler got there first
		}
		if err := a.cs.Tracker().Add(p); err != nil {
			panic(err)
		}
	}
	a.cs.PrependReactor("*", "pods", a.react)
	return a
}

// react serves every request on pods: it counts it, and serves a binding
// itself (bind); the fake serves the rest.
func (a *api) react(action clienttesting.Action) (bool, runtime.Object, error) {
	// The fake serves one request at a time: latency here is per
	// request, not concurrent as a real server's would be.
	time.Sleep(a.latency)
	a.mu.Lock()
	a.n[action.GetVerb()]++
	n := a.n[action.GetVerb()]
	a.mu.Unlock()
	create, ok := action.(clienttesting.CreateActionImpl)
	if !ok {
		return false, nil, nil // the fake's own handling
	}
	return true, nil, a.bind(create.GetObject().(*v1.Binding), n)
}

// bind is pods/binding as kube-apiserver serves it — a pod already on a
// node is a 409 — with faults on the nth binding: now and then a 503, and
// now and then a binding that lands but whose response is lost.
func (a *api) bind(b *v1.Binding, n int) error {
	obj, err := a.cs.Tracker().Get(podsGVR, b.Namespace, b.Name)
	if err != nil {
		return err
	}
	pod := obj.(*v1.Pod).DeepCopy()
	if pod.Spec.NodeName != "" {
		return apierrors.NewConflict(podsGVR.GroupResource(), b.Name, fmt.Errorf("pod %s is already assigned to node %q", b.Name, pod.Spec.NodeName))
	}
	if n%50 == 10 { // now and then the server is unavailable
		return apierrors.NewServiceUnavailable("etcd leader changed")
	}
	pod.Spec.NodeName = b.Target.Name
	if err := a.cs.Tracker().Update(podsGVR, pod, b.Namespace); err != nil {
		return err
	}
	if n%50 == 30 { // the binding landed, its response did not
		return apierrors.NewTimeoutError("response lost", 0)
	}
	return nil
}

func (a *api) pod(name string) *v1.Pod {
	obj, err := a.cs.Tracker().Get(podsGVR, "default", name)
	if err != nil {
		panic(err)
	}
	return obj.(*v1.Pod)
}

func (a *api) count(verb string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[verb]
}
