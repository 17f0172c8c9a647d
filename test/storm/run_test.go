package storm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// The objects of a run.
const (
	namespace = "storm"
	// stormLabel is the node label the storm's pods select and no node
	// has.
	stormLabel = "storm.dispatch.example/never"
	// highClass is the PriorityClass of the schedulable pods in the
	// "high" variant.
	highClass = "storm-high"
	// stormPrefix and podPrefix name the unschedulable and the
	// schedulable pods.
	stormPrefix = "storm-"
	podPrefix   = "pod-"
)

// runStorm runs the workload once with the scheduler binary bin as v, on a
// fresh apiserver over etcd, and returns what the server saw. With out
// set, the scheduler's log goes into that directory.
func runStorm(t *testing.T, etcd *apiserver.Etcd, bin string, v schedVariant, prio string, w Workload, out string) *Result {
	t.Helper()
	// The storm drains at 50 requests per second; allow three times that
	// and three minutes for the rest, a bound that only a hung run meets.
	timeout := 3*time.Minute + time.Duration(w.Unschedulable)*60*time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()

	// The Priority admission plugin stays on (it resolves the class of
	// the high-priority pods); TaintNodesByCondition goes, as in
	// scheduler_perf: no node lifecycle controller runs to lift its
	// not-ready taint from new nodes.
	s := apiserver.Start(t, apiserver.WithEtcd(etcd),
		apiserver.WithFlags("--disable-admission-plugins=ServiceAccount,TaintNodesByCondition"))
	admin := s.AdminClient
	setUp(ctx, t, admin, w)

	rec := newRecorder(w)
	watchPods(t, admin, rec)

	// The storm's pods exist before the scheduler starts, which lists
	// them all at once: its queue holds the whole burst from the start,
	// however fast this machine creates pods.
	burstStart := time.Now()
	require.NoError(t, createMany(ctx, admin, w.Unschedulable, 16, func(i int) *corev1.Pod { return stormPodOf(w, i, prio) }))
	t.Logf("created %d unschedulable pods in %v", w.Unschedulable, time.Since(burstStart).Round(time.Millisecond))

	logPath := ""
	if out != "" {
		require.NoError(t, os.MkdirAll(out, 0o755))
		logPath = filepath.Join(out, fmt.Sprintf("scheduler-%s-%s.log", prio, v.name))
	}
	// The recorder's clock starts as the scheduler does.
	rec.start()
	sched := startScheduler(t, bin, s.Config, v, logPath)
	require.Equal(t, v.dispatcher, sched.ready.Dispatcher, "the %s binary links the wrong dispatcher (k8s.io/kubernetes %s)", v.build, sched.ready.Kubernetes)
	require.Equal(t, v.async, sched.ready.Async)
	t.Logf("scheduler: %s dispatcher, async %v, k8s.io/kubernetes %s", sched.ready.Dispatcher, sched.ready.Async, sched.ready.Kubernetes)

	// Once the storm's first condition lands the storm is under way: the
	// schedulable pods arrive, at a steady rate.
	select {
	case <-rec.firstFailure:
	case <-ctx.Done():
		t.Fatalf("no PodScheduled=False condition after %v\nscheduler log (tail):\n%s", timeout, sched.logTail())
	}
	arrivals := time.Now()
	require.NoError(t, arrive(ctx, admin, w, func(i int) *corev1.Pod { return schedulablePodOf(w, i, prio) }))
	t.Logf("created %d schedulable pods in %v", w.Schedulable, time.Since(arrivals).Round(time.Millisecond))

	var stalled <-chan struct{} // nil: the storm shape waits for every pod
	if w.Shape == shapePreempt {
		stalled = rec.stalled(ctx, preemptStall)
	}
	select {
	case <-rec.complete:
	case <-stalled:
		t.Logf("no preemptor bound for %v after the storm drained: stopping with these unbound%s", preemptStall, unbound(admin))
	case <-ctx.Done():
		bound, failed := rec.progress()
		sched.stop(t)
		t.Fatalf("after %v: %d of %d schedulable pods bound, %d of %d unschedulable pods with PodScheduled=False%s\nscheduler log (tail):\n%s",
			timeout, bound, w.Schedulable, failed, w.Unschedulable, unbound(admin), sched.logTail())
	}
	bound, _ := rec.progress()
	if !sched.settle(bound) {
		t.Logf("the scheduler did not count %d pods scheduled within %v of their bindings; stopping it anyway",
			bound, schedulerSettleTimeout)
	}
	counters := sched.stop(t)

	// Read back what the server holds, and what it was asked.
	pods, err := admin.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	return measure(rec, pods.Items, s.Proxy.Requests(), resultMeta{
		priority:   prio,
		scheduler:  v.name,
		workload:   w,
		dispatcher: sched.ready.Dispatcher,
		kubernetes: sched.ready.Kubernetes,
		counters:   counters,
	})
}

// unbound describes the schedulable pods the server holds unbound, for a
// run that timed out: their nominated node and PodScheduled condition.
func unbound(c kubernetes.Interface) string {
	pods, err := c.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("\n(listing the pods: %v)", err)
	}
	var b strings.Builder
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Name, podPrefix) || p.Spec.NodeName != "" {
			continue
		}
		fmt.Fprintf(&b, "\n%s unbound: nominated node %q", p.Name, p.Status.NominatedNodeName)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				fmt.Fprintf(&b, ", PodScheduled=%s %s: %s", c.Status, c.Reason, c.Message)
			}
		}
	}
	return b.String()
}

// setUp creates the namespace, the PriorityClasses and the nodes, and in
// the preempt shape the victims that fill the nodes.
func setUp(ctx context.Context, t *testing.T, c kubernetes.Interface, w Workload) {
	t.Helper()
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, pc := range priorityClasses(w) {
		_, err = c.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, forEach(ctx, w.Nodes, 8, func(ctx context.Context, i int) error {
		_, err := c.CoreV1().Nodes().Create(ctx, node(i), metav1.CreateOptions{})
		return err
	}))
	if n := victims(w); n > 0 {
		require.NoError(t, createMany(ctx, c, n, 16, func(i int) *corev1.Pod { return victimPod(w, i) }))
	}
}

// priorityClasses are the PriorityClasses a run of w needs: the high
// class, and in the preempt shape the victims' too.
func priorityClasses(w Workload) []*schedulingv1.PriorityClass {
	high := &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: highClass},
		Value:      w.HighPriority,
	}
	if w.Shape != shapePreempt {
		return []*schedulingv1.PriorityClass{high}
	}
	return preemptClasses(w)
}

// node is the i-th node: ready, room for 110 pods, no taints.
func node(i int) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("128Gi"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   fmt.Sprintf("node-%03d", i),
			Labels: map[string]string{corev1.LabelHostname: fmt.Sprintf("node-%03d", i)},
		},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Phase:       corev1.NodeRunning,
		},
	}
}

// pod is a pause pod with small requests.
func pod(name string) *corev1.Pod {
	requests := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("100Mi"),
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:      "pause",
				Image:     "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Requests: requests, Limits: requests},
			}},
		},
	}
}

// stormPod is the i-th pod of the storm: it selects a label no node has.
func stormPod(i int) *corev1.Pod {
	p := pod(fmt.Sprintf("%s%05d", stormPrefix, i))
	p.Spec.NodeSelector = map[string]string{stormLabel: "true"}
	return p
}

// schedulablePod is the i-th schedulable pod, of the high PriorityClass in
// the "high" variant.
func schedulablePod(i int, prio string) *corev1.Pod {
	p := pod(fmt.Sprintf("%s%04d", podPrefix, i))
	if prio == "high" {
		p.Spec.PriorityClassName = highClass
	}
	return p
}

// createMany creates n pods, workers at a time.
func createMany(ctx context.Context, c kubernetes.Interface, n, workers int, mk func(int) *corev1.Pod) error {
	return forEach(ctx, n, workers, func(ctx context.Context, i int) error {
		return createPod(ctx, c, mk(i))
	})
}

// createPod creates p, again when the server answered that it could not
// in time (a starved apiserver on a loaded machine does): a create that
// took effect all the same then finds the pod there, which is success.
// The informer's time of the pod's creation is what the test measures, so
// a late create only shifts that pod's start.
func createPod(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) error {
	for attempt := 1; ; attempt++ {
		_, err := c.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{})
		switch {
		case err == nil:
			return nil
		case attempt > 1 && apierrors.IsAlreadyExists(err):
			return nil
		case attempt < 5 && (apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err)):
			select {
			case <-time.After(time.Duration(attempt) * 200 * time.Millisecond): // a backoff, not a synchronisation
			case <-ctx.Done():
				return err
			}
		default:
			return err
		}
	}
}

// arrive creates the schedulable pods one every w.Every, each in a
// goroutine of its own so that a slow create does not delay the next, and
// returns when all are created.
func arrive(ctx context.Context, c kubernetes.Interface, w Workload, mk func(int) *corev1.Pod) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	start := time.Now()
	for i := range w.Schedulable {
		// The pacing of the workload, not a synchronisation.
		time.Sleep(time.Until(start.Add(time.Duration(i) * w.Every)))
		wg.Go(func() {
			if err := createPod(ctx, c, mk(i)); err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// forEach calls f for 0..n-1, workers at a time, and returns the first
// error; after one, the calls not yet started are not made.
func forEach(ctx context.Context, n, workers int, f func(context.Context, int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	for range min(workers, n) {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= n || first != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := f(ctx, i); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
					cancel()
				}
			}
		})
	}
	wg.Wait()
	return first
}

// cmpErr keeps the first error.
func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// watchPods feeds rec from an informer on the namespace's pods, through
// the admin client (not through the proxy, which records only the
// scheduler's requests), until the test ends.
func watchPods(t *testing.T, c kubernetes.Interface, rec *recorder) {
	t.Helper()
	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(namespace))
	informer := factory.Core().V1().Pods().Informer()
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				rec.observe(p)
			}
		},
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				rec.observe(p)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				rec.gone(p)
			}
		},
	})
	require.NoError(t, err)
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() {
		close(stop)
		factory.Shutdown()
	})
	for typ, ok := range factory.WaitForCacheSync(t.Context().Done()) {
		require.True(t, ok, "informer for %v did not sync", typ)
	}
}
