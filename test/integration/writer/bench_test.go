package writer_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	"github.com/coalescer/dispatch/kube/writer"
)

// The controller workload of BenchmarkStatusWriters: benchObjects widgets;
// a desired-status change to one of them every 1/benchChangeRate, round
// robin, and a Ready flip to one of them every benchFlipEvery, for
// benchWindow; the client at benchQPS requests a second (burst benchBurst)
// in every variant. The changes come four times faster than the client
// may write: a storm, in which the three ways part.
const (
	benchObjects    = 100
	benchChangeRate = 200 // desired-status changes a second
	benchFlipEvery  = 100 * time.Millisecond
	benchWindow     = 5 * time.Second
	benchQPS        = 50
	benchBurst      = 10
)

// BenchmarkStatusWriters runs one controller workload against a real
// kube-apiserver, its status written three ways:
//
//   - sync: Reconcile writes the status itself, Status().Update from the
//     informer's object, and requeues the key (rate limited) on a conflict;
//   - queue: Reconcile hands a status mutation to a queue-of-keys status
//     updater, a model of Contour's and Envoy Gateway's (statusUpdater);
//   - writer: Reconcile hands its desire to kube/writer.
//
// Each variant is a controller as controller-runtime runs one: events add
// the object's key to a rate-limited work queue (which holds a key once),
// and one worker reconciles: it reads the desired state and the informer's
// object and writes, or hands over, the whole desired status — observed
// (the last change's number) and ready (the last flip's). Every variant's
// client is limited to benchQPS: client-go's bucket for sync and queue, the
// writer's own limiter for writer.
//
// Per run (-benchtime=1x; run it with -count):
//
//   - reconciles/s: reconciles finished during the window, per second;
//   - reconcile-p99-µs: the 99th percentile of one Reconcile's duration,
//     which for the writer is the time to hand a desire over (the loop
//     never waits on the network);
//   - writes/change: status writes the server received (at the proxy) per
//     desired-status change made;
//   - stale-p50-ms, stale-p99-ms: from a change to the informer seeing a
//     status with it or a later one;
//   - flip-p99-ms: the same for Ready flips, made during the storm;
//   - alloc-MB: bytes allocated by the test process during the run (the
//     apiserver and etcd run in processes of their own): the controller, its
//     informer and clients, and the recording proxy in front of the
//     apiserver, whose share grows with the requests sent;
//   - drain-s: from the window's end until every object shows its last
//     desired status.
func BenchmarkStatusWriters(b *testing.B) {
	st := startStack(b)
	runs := 0
	for _, v := range []string{"sync", "queue", "writer"} {
		b.Run("variant="+v, func(b *testing.B) {
			for range b.N {
				runs++ // -count runs this function again on the same server
				runWorkload(b, st, v, fmt.Sprintf("bench-%s-%d", v, runs))
			}
		})
	}
}

// desired is the world the controller reconciles toward: per object, the
// last change's number and the last flip's.
type desired struct {
	mu       sync.Mutex
	observed []int64
	ready    []int64
	// made[i] holds the times of the changes (or flips) to object i not
	// yet seen landed, in order of their numbers: made[i][k] is change
	// seen[i]+k+1.
	changes, flips landing
}

// landing tracks the numbered changes of each object from made to seen.
type landing struct {
	made  [][]time.Time
	seen  []int64
	delay []time.Duration
}

func newLanding(n int) landing {
	return landing{made: make([][]time.Time, n), seen: make([]int64, n)}
}

// add records change number v of object i, made at t.
func (l *landing) add(i int, t time.Time) { l.made[i] = append(l.made[i], t) }

// saw records that object i shows change v: v and every earlier change
// have landed.
func (l *landing) saw(i int, v int64, now time.Time) {
	for l.seen[i] < v && len(l.made[i]) > 0 {
		l.delay = append(l.delay, now.Sub(l.made[i][0]))
		l.made[i] = l.made[i][1:]
		l.seen[i]++
	}
}

func (l *landing) pending() int {
	n := 0
	for _, m := range l.made {
		n += len(m)
	}
	return n
}

// reconciler is one way of writing the status: reconcile runs in the
// controller's one worker; requeue says to add the key again, rate
// limited (a conflict seen in the loop).
type reconciler interface {
	reconcile(ctx context.Context, obj *U, want status) (requeue bool)
	close()
}

// status is the desired status of one object.
type status struct{ observed, ready int64 }

func (s status) change() writer.Change[*U] {
	return setStatus(map[string]any{"observed": s.observed, "ready": fmt.Sprint(s.ready)})
}

func statusIn(u *U) status {
	o, _, _ := unstructured.NestedInt64(u.Object, "status", "observed")
	r, _, _ := unstructured.NestedString(u.Object, "status", "ready")
	var ready int64
	_, _ = fmt.Sscan(r, &ready)
	return status{observed: o, ready: ready}
}

func runWorkload(b *testing.B, st *stack, variant, ns string) {
	b.StopTimer()
	st.namespace(b, ns)
	cfg := st.controller(b, ns)
	objs := st.createWidgets(b, ns, "w", benchObjects)
	index := make(map[string]int, benchObjects)
	for i, o := range objs {
		index[o.GetName()] = i
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The controller's cache: an informer on ns, with the controller's
	// credentials, and the landing of every change seen through it.
	informerClient, err := dynamic.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(informerClient, 0, ns, nil)
	inf := factory.ForResource(widgets)
	world := &desired{
		observed: make([]int64, benchObjects), ready: make([]int64, benchObjects),
		changes: newLanding(benchObjects), flips: newLanding(benchObjects),
	}
	observe := func(obj any) {
		u, ok := obj.(*U)
		if !ok {
			return
		}
		i, ok := index[u.GetName()]
		if !ok {
			return
		}
		s := statusIn(u)
		now := time.Now()
		world.mu.Lock()
		world.changes.saw(i, s.observed, now)
		world.flips.saw(i, s.ready, now)
		world.mu.Unlock()
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, n any) { observe(n) },
	})
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		b.Fatal("the informer did not sync")
	}

	get := func(ns, name string) (*U, error) {
		o, err := inf.Lister().ByNamespace(ns).Get(name)
		if err != nil {
			return nil, err
		}
		return o.(*U), nil
	}
	r := newReconciler(b, variant, cfg, get)
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[int]())
	var (
		reconciles atomic.Int64
		durations  []time.Duration
		loop       sync.WaitGroup
	)
	loop.Go(func() {
		for {
			i, shutdown := queue.Get()
			if shutdown {
				return
			}
			began := time.Now()
			if obj, err := get(ns, objs[i].GetName()); err == nil {
				world.mu.Lock()
				want := status{observed: world.observed[i], ready: world.ready[i]}
				world.mu.Unlock()
				if r.reconcile(ctx, obj, want) {
					queue.AddRateLimited(i)
				} else {
					queue.Forget(i)
				}
			}
			durations = append(durations, time.Since(began))
			reconciles.Add(1)
			queue.Done(i)
		}
	})

	writesBefore := st.Proxy.Count(isStatusWrite(ns))
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	b.StartTimer()

	// The storm: changes round robin, flips every benchFlipEvery.
	began := time.Now()
	changes := 0
	tick := time.NewTicker(time.Second / benchChangeRate)
	flipEvery := int(benchFlipEvery * benchChangeRate / time.Second)
	for n := 0; time.Since(began) < benchWindow; n++ {
		<-tick.C
		i := n % benchObjects
		now := time.Now()
		world.mu.Lock()
		if n%flipEvery == flipEvery-1 {
			i = (n / flipEvery * 7) % benchObjects // another walk than the changes'
			world.ready[i]++
			world.flips.add(i, now)
		} else {
			world.observed[i]++
			world.changes.add(i, now)
			changes++
		}
		world.mu.Unlock()
		queue.Add(i)
	}
	tick.Stop()
	window := time.Since(began)
	inWindow := reconciles.Load()

	// The drain: until every change and flip has landed.
	drainBegan := time.Now()
	for {
		world.mu.Lock()
		left := world.changes.pending() + world.flips.pending()
		world.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Since(drainBegan) > 2*callTimeout {
			b.Fatalf("%s: %d changes not landed after %v", variant, left, time.Since(drainBegan))
		}
		time.Sleep(10 * time.Millisecond)
	}
	drain := time.Since(drainBegan)
	b.StopTimer()
	runtime.ReadMemStats(&mem1)
	queue.ShutDown()
	loop.Wait()
	r.close()
	writes := st.Proxy.Count(isStatusWrite(ns)) - writesBefore

	world.mu.Lock()
	defer world.mu.Unlock()
	b.ReportMetric(float64(inWindow)/window.Seconds(), "reconciles/s")
	b.ReportMetric(float64(quantile(durations, 0.99).Microseconds()), "reconcile-p99-µs")
	b.ReportMetric(float64(writes)/float64(changes), "writes/change")
	b.ReportMetric(ms(quantile(world.changes.delay, 0.5)), "stale-p50-ms")
	b.ReportMetric(ms(quantile(world.changes.delay, 0.99)), "stale-p99-ms")
	b.ReportMetric(ms(quantile(world.flips.delay, 0.99)), "flip-p99-ms")
	b.ReportMetric(float64(mem1.TotalAlloc-mem0.TotalAlloc)/(1<<20), "alloc-MB")
	b.ReportMetric(drain.Seconds(), "drain-s")
	// The timer's own ns/op says only how long the run took.
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(math.Ceil(q*float64(len(s))))-1]
}

func newReconciler(b *testing.B, variant string, cfg *rest.Config, get func(ns, name string) (*U, error)) reconciler {
	limited := rest.CopyConfig(cfg)
	limited.QPS, limited.Burst = benchQPS, benchBurst
	switch variant {
	case "sync":
		c, err := dynamic.NewForConfig(limited)
		if err != nil {
			b.Fatal(err)
		}
		return &syncStatus{c: c.Resource(widgets)}
	case "queue":
		c, err := dynamic.NewForConfig(limited)
		if err != nil {
			b.Fatal(err)
		}
		return newStatusUpdater(c.Resource(widgets), get)
	case "writer":
		w := newWriter(b, cfg, writer.Options[*U]{
			QPS: benchQPS, Burst: benchBurst,
			Classes: map[string]int{"ready": 10, "routine": 0},
		})
		return &writerStatus{w: w}
	}
	b.Fatalf("unknown variant %q", variant)
	return nil
}

// syncStatus writes the status in Reconcile, as many operators do: one
// blocking Status().Update per pass whose object's status differs, from
// the informer's object; a conflict (the cache behind the server) returns
// the key to the work queue, rate limited.
type syncStatus struct {
	c dynamic.NamespaceableResourceInterface
}

func (s *syncStatus) reconcile(ctx context.Context, obj *U, want status) bool {
	if statusIn(obj) == want {
		return false
	}
	o := obj.DeepCopy()
	_ = want.change()(o)
	_, err := s.c.Namespace(o.GetNamespace()).UpdateStatus(ctx, o, metav1.UpdateOptions{})
	return err != nil
}

func (s *syncStatus) close() {}

// writerStatus hands the desire to kube/writer: a Ready flip in class
// "ready", before routine changes.
type writerStatus struct{ w *writer.Writer[*U] }

func (s *writerStatus) reconcile(_ context.Context, obj *U, want status) bool {
	class := "routine"
	if statusIn(obj).ready != want.ready {
		class = "ready"
	}
	return s.w.Set(obj, writer.Desire[*U]{Status: want.change()}, writer.SetOptions{Class: class}) != nil
}

func (s *writerStatus) close() {}

// statusUpdater is a model of the status updater that Contour
// (internal/k8s/statusupdater.go) and Envoy Gateway
// (internal/provider/kubernetes/status_updater.go) run, written for this
// benchmark from what they do — a model, not their code. It keeps what
// decides their figures:
//
//   - Reconcile sends an update — the object's key and a mutation that
//     sets the status it computed — on a channel of capacity 100, and
//     blocks when the channel is full;
//   - one goroutine takes the updates in order, one at a time: reads the
//     object from the informer's cache, applies the mutation, skips the
//     write if the status is unchanged, else Status().Update;
//   - a conflict or a not-found is retried with client-go's
//     retry.DefaultBackoff (4 tries, 10 ms growing fivefold), asleep in
//     that goroutine, each try from the cache again (Envoy Gateway's);
//   - no coalescing of updates to one object, no priority, the client's
//     own rate limit.
//
// It leaves out what does not change the figures: leader election, logs,
// metrics, and the conversion between typed and unstructured objects.
type statusUpdater struct {
	c       dynamic.NamespaceableResourceInterface
	lister  func(ns, name string) (*U, error)
	updates chan statusUpdate
	done    sync.WaitGroup
}

type statusUpdate struct {
	namespace, name string
	mutate          func(*U)
}

func newStatusUpdater(c dynamic.NamespaceableResourceInterface, lister func(ns, name string) (*U, error)) *statusUpdater {
	u := &statusUpdater{c: c, lister: lister, updates: make(chan statusUpdate, 100)}
	u.done.Go(func() {
		for upd := range u.updates {
			u.apply(upd)
		}
	})
	return u
}

func (u *statusUpdater) apply(upd statusUpdate) {
	_ = retry.OnError(retry.DefaultBackoff, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsNotFound(err)
	}, func() error {
		obj, err := u.lister(upd.namespace, upd.name)
		if err != nil {
			return err
		}
		o := obj.DeepCopy()
		upd.mutate(o)
		if statusIn(o) == statusIn(obj) {
			return nil
		}
		_, err = u.c.Namespace(o.GetNamespace()).UpdateStatus(context.Background(), o, metav1.UpdateOptions{})
		return err
	})
}

func (u *statusUpdater) reconcile(_ context.Context, obj *U, want status) bool {
	change := want.change()
	u.updates <- statusUpdate{namespace: obj.GetNamespace(), name: obj.GetName(), mutate: func(o *U) { _ = change(o) }}
	return false
}

func (u *statusUpdater) close() {
	close(u.updates)
	u.done.Wait()
}
