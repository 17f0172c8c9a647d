package benchmarks

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/scheduler"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	apidispatcher "k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher"
	apicalls "k8s.io/kubernetes/pkg/scheduler/framework/api_calls"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
)

// BenchmarkAPIDispatcher times one call through kube-scheduler's
// fwk.APIDispatcher, Add to executed to OnFinish, from parallel adders
// (b.RunParallel, GOMAXPROCS of them), each keeping up to adderWindow calls
// outstanding on its own OnFinish channel. Calls alternate between the
// scheduler's two call types (a binding and a status patch, with upstream's
// relevances), each for a pod of its own (runAdder says when not), and
// each executes one request on a fake clientset that answers at once. The
// implementations:
//
//   - upstream: k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher at
//     the scheduler's default parallelism (16), which always records the
//     scheduler's metrics;
//   - dropin: kube/scheduler's Dispatcher at its defaults (16 workers),
//     without a Metrics, and with one that records the scheduler's own
//     metrics as upstream does (its pending-calls gauge included);
//   - dropin/bare: the drop-in without the two features its defaults turn
//     on that upstream's dispatcher does not have — each call's timeout
//     (Options.Timeout −1) and the workers kept for bindings
//     (Start.ReservedWorkers −1);
//   - core: the same calls Posted to a dispatch.Dispatcher with 16 workers,
//     an exec that runs the call, and an OnDone that sends to OnFinish —
//     the floor the adapter adds its own work to;
//   - core/dropin-config: core, configured as the drop-in's defaults
//     configure it (dropinConfig), with none of the adapter's own code.
//
// So the drop-in's cost splits in two: what its configuration costs the
// core (core/dropin-config against core, and dropin/metrics=off against
// dropin/bare) and the adapter's own work per call (dropin/metrics=off
// against core/dropin-config, and dropin/bare against core).
func BenchmarkAPIDispatcher(b *testing.B) {
	benchAPIDispatcher(b, func(i uint64) fwk.APICall { return newSchedCall(i) })
}

// BenchmarkOwnWork is BenchmarkAPIDispatcher with calls whose Execute
// sends no request and returns nil at once: what is left per call is each
// implementation's own work (its queue, its goroutines or workers, its
// bookkeeping, the OnFinish hand-off), the benchmark's adders and the
// garbage collector, with no client's work to dilute a difference.
func BenchmarkOwnWork(b *testing.B) {
	benchAPIDispatcher(b, newFreeCall)
}

// freeCall is a schedCall whose execution sends nothing.
type freeCall struct{ schedCall }

func newFreeCall(i uint64) fwk.APICall { return &freeCall{*newSchedCall(i)} }

func (c *freeCall) Execute(context.Context, clientset.Interface) error { return nil }

// benchAPIDispatcher runs BenchmarkAPIDispatcher's implementations on the
// calls newCall makes (call i of the run).
func benchAPIDispatcher(b *testing.B, newCall func(i uint64) fwk.APICall) {
	for _, impl := range []struct {
		name string
		new  func(b *testing.B, client clientset.Interface) adder
	}{
		{"upstream", newUpstreamAdder},
		{"dropin/metrics=off", func(b *testing.B, c clientset.Interface) adder { return newDropinAdder(b, c, nil) }},
		{"dropin/metrics=on", func(b *testing.B, c clientset.Interface) adder { return newDropinAdder(b, c, schedMetrics{}) }},
		{"dropin/bare", func(b *testing.B, c clientset.Interface) adder {
			return newDropinAdderWith(b, c, scheduler.Options{Timeout: -1, Start: dispatch.StartPolicy{ReservedWorkers: -1}})
		}},
		{"core", func(b *testing.B, c clientset.Interface) adder { return newCoreAdder(b, c, 0) }},
		{"core/dropin-config", func(b *testing.B, c clientset.Interface) adder { return newCoreAdder(b, c, dropinConfig) }},
	} {
		b.Run("impl="+impl.name, func(b *testing.B) {
			runAdder(b, impl.new(b, instantClient()), newCall)
		})
	}
}

// runAdder times a's calls, made by newCall, from GOMAXPROCS parallel
// adders each keeping up to adderWindow calls outstanding, then closes a.
//
// Each call is for a pod of its own while the calls stay within a lap of
// uids. But a call can stay longer: with one core, a goroutine that runs
// the call (upstream's) or has taken it (a worker preempted between taking
// the call and running it) can wait in the runtime's run queue while the
// adders go on. Then the next call for that pod overwrites the pending one
// (upstream's and the drop-in's: its OnFinish hears fwk.ErrCallOverwritten)
// or joins it (the core's Post: errJoined). Either is counted, not failed,
// and reported as merged/op: a call merged is one execution fewer.
func runAdder(b *testing.B, a adder, newCall func(i uint64) fwk.APICall) {
	var seq, merged atomic.Uint64
	heard := func(err error) {
		switch {
		case err == nil:
		case errors.Is(err, fwk.ErrCallOverwritten) || errors.Is(err, errJoined):
			merged.Add(1)
		default:
			b.Error(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		fin := make(chan error, adderWindow)
		out := 0
		for pb.Next() {
			if out == adderWindow {
				heard(<-fin)
				out--
			}
			if err := a.add(newCall(seq.Add(1)), fin); err != nil {
				b.Error(err)
				return
			}
			out++
		}
		for ; out > 0; out-- {
			heard(<-fin)
		}
	})
	b.StopTimer()
	a.close()
	b.ReportMetric(float64(merged.Load())/float64(b.N), "merged/op")
}

// errJoined is what newCoreAdder tells an add that joined a pending call
// for the same pod: the core tells a call's outcome once (OnDone), with
// the number of adds it served.
var errJoined = errors.New("joined the pending call for the same pod")

// schedulerParallelism is kube-scheduler's default parallelism: upstream's
// goroutine bound, and the drop-in's default workers.
const schedulerParallelism = 16

// adderWindow is how many calls one adder keeps outstanding: its OnFinish
// channel's buffer, so that no result is dropped.
const adderWindow = 64

// adder is one implementation under BenchmarkAPIDispatcher.
type adder struct {
	add   func(c fwk.APICall, fin chan<- error) error
	close func()
}

// uids are the pods' UIDs, reused round the ring: far more than the calls
// outstanding at once, so no two outstanding calls share a pod.
var uids = func() []types.UID {
	u := make([]types.UID, 1<<16)
	for i := range u {
		u[i] = types.UID("pod-" + strconv.Itoa(i))
	}
	return u
}()

var (
	patchBody = []byte(`{"status":{"conditions":[{"type":"PodScheduled","status":"False"}]}}`)
	bindingOf = &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod"}, Target: corev1.ObjectReference{Kind: "Node", Name: "node"}}
)

// schedCall is one of the scheduler's calls: its type, its pod, and the
// one request it sends.
type schedCall struct {
	typ fwk.APICallType
	uid types.UID
}

func newSchedCall(i uint64) *schedCall {
	t := apicalls.PodStatusPatch
	if i%2 == 0 {
		t = apicalls.PodBinding
	}
	return &schedCall{typ: t, uid: uids[i%uint64(len(uids))]}
}

func (c *schedCall) CallType() fwk.APICallType { return c.typ }
func (c *schedCall) UID() types.UID            { return c.uid }
func (c *schedCall) Execute(ctx context.Context, client clientset.Interface) error {
	pods := client.CoreV1().Pods("default")
	if c.typ == apicalls.PodBinding {
		return pods.Bind(ctx, bindingOf, metav1.CreateOptions{})
	}
	_, err := pods.Patch(ctx, "pod", types.StrategicMergePatchType, patchBody, metav1.PatchOptions{}, "status")
	return err
}
func (c *schedCall) Merge(fwk.APICall) error                       { return nil }
func (c *schedCall) Sync(obj metav1.Object) (metav1.Object, error) { return obj, nil }
func (c *schedCall) IsNoOp() bool                                  { return false }

// instantClient is a fake clientset whose every request succeeds at once,
// without touching its object tracker.
func instantClient() clientset.Interface {
	c := fake.NewClientset()
	c.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &corev1.Pod{}, nil
	})
	return c
}

func newUpstreamAdder(b *testing.B, client clientset.Interface) adder {
	schedmetrics.Register()
	ad := apidispatcher.New(client, schedulerParallelism, apicalls.Relevances)
	ad.Run(klog.Background())
	return adder{
		add: func(c fwk.APICall, fin chan<- error) error {
			return ad.Add(c, fwk.APICallOptions{OnFinish: fin})
		},
		close: ad.Close,
	}
}

func newDropinAdder(b *testing.B, client clientset.Interface, m scheduler.Metrics) adder {
	return newDropinAdderWith(b, client, scheduler.Options{Metrics: m})
}

func newDropinAdderWith(b *testing.B, client clientset.Interface, o scheduler.Options) adder {
	schedmetrics.Register()
	d, err := scheduler.New(client, apicalls.Relevances, o)
	if err != nil {
		b.Fatal(err)
	}
	d.Start(klog.Background())
	return adder{
		add: func(c fwk.APICall, fin chan<- error) error {
			return d.Add(c, fwk.APICallOptions{OnFinish: fin})
		},
		close: func() {
			if err := d.Close(context.Background()); err != nil {
				b.Error(err)
			}
		},
	}
}

// coreCall is what the core carries for newCoreAdder: the call and where
// its outcome goes.
type coreCall struct {
	call fwk.APICall
	fin  chan<- error
}

// The drop-in's documented defaults that dropinConfig sets in the core
// (kube/scheduler's Options): bindings at priority 20 and status patches
// at 0, in bands of 10; a timeout of five minutes from Add; a quarter of
// the workers kept for the binding's band.
const (
	dropinBindingPriority = 20
	dropinAgingBand       = 10
	dropinTimeout         = 5 * time.Minute
	dropinReserved        = schedulerParallelism / 4
)

// coreConfig is the set of the drop-in's defaults newCoreAdder gives the
// core, one bit each.
type coreConfig uint8

const (
	// withDeadline: each call's deadline, dropinTimeout after its Post.
	withDeadline coreConfig = 1 << iota
	// withDroppable: a status patch droppable for a binding at capacity.
	withDroppable
	// withReserved: dropinReserved workers kept for the binding's band.
	withReserved
	// withBands: the aging band, dropinAgingBand (the core's default).
	withBands
	// withLabel: the call type as each call's label.
	withLabel
	// withTenants: the call types named in Config.Tenants, so that a
	// type's tenant is kept while it has no call.
	withTenants
	// withObserver: an Observer, as the drop-in always has (its log lines).
	withObserver

	// dropinConfig is every one: the core as the drop-in's defaults
	// configure it.
	dropinConfig = withDeadline | withDroppable | withReserved | withBands | withLabel | withTenants | withObserver
)

// quietObserver is an Observer of no methods of its own, where the
// drop-in's logs its retries, drops and switches: the core delivers its
// events all the same.
type quietObserver struct{ dispatch.NopObserver }

// newCoreAdder Posts the calls to the core, each with its call type as
// its tenant and a binding at dropinBindingPriority, and with the drop-in's
// defaults that with names.
func newCoreAdder(tb testing.TB, client clientset.Interface, with coreConfig) adder {
	cfg := dispatch.Config[types.UID, coreCall]{
		Workers:  schedulerParallelism,
		Capacity: 100_000,
		// One result per add the call served (runAdder says when there
		// are more than one): the call's, and errJoined for the others.
		OnDone: func(r dispatch.Result[types.UID, coreCall]) {
			err := r.Err
			for range r.Waiters {
				select {
				case r.Call.fin <- err:
				default:
				}
				err = errJoined
			}
		},
	}
	if with&withBands != 0 {
		cfg.AgingBand = dropinAgingBand
	}
	if with&withReserved != 0 {
		cfg.Start = dispatch.StartPolicy{ReservedWorkers: dropinReserved, UrgentPriority: dropinBindingPriority}
	}
	if with&withLabel != 0 {
		cfg.Label = func(_ types.UID, c coreCall) string { return string(c.call.CallType()) }
	}
	if with&withTenants != 0 {
		cfg.Tenants = map[string]dispatch.TenantConfig{string(apicalls.PodBinding): {}, string(apicalls.PodStatusPatch): {}}
	}
	if with&withObserver != 0 {
		cfg.Observer = quietObserver{}
	}
	d, err := dispatch.New(func(ctx context.Context, _ types.UID, c coreCall) error {
		return c.call.Execute(ctx, client)
	}, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return adder{
		add: func(c fwk.APICall, fin chan<- error) error {
			o := dispatch.SubmitOptions{Tenant: string(c.CallType())}
			if c.CallType() == apicalls.PodBinding {
				o.Priority = dropinBindingPriority
			}
			if with&withDeadline != 0 {
				o.Timeout = dropinTimeout // as the drop-in sets it
			}
			if with&withDroppable != 0 {
				o.Droppable = o.Priority < dropinBindingPriority
			}
			return d.Post(c.UID(), coreCall{c, fin}, o)
		},
		close: func() {
			if err := d.Close(context.Background()); err != nil {
				tb.Error(err)
			}
		},
	}
}

// BenchmarkCoreDropinConfig is BenchmarkOwnWork's core row with one of the
// drop-in's defaults at a time (with=NAME), and with all of them: what
// each costs the core per call, with no request to dilute it.
func BenchmarkCoreDropinConfig(b *testing.B) {
	for _, w := range []struct {
		name string
		with coreConfig
	}{
		{"none", 0},
		{"deadline", withDeadline},
		{"droppable", withDroppable},
		{"reserved", withReserved},
		{"bands", withBands},
		{"label", withLabel},
		{"tenants", withTenants},
		{"observer", withObserver},
		{"all", dropinConfig},
	} {
		b.Run("with="+w.name, func(b *testing.B) {
			runAdder(b, newCoreAdder(b, instantClient(), w.with), newFreeCall)
		})
	}
}

// schedMetrics records kube-scheduler's own async-call metrics, as
// upstream's dispatcher does and the drop-in package's Metrics does.
type schedMetrics struct{}

func (schedMetrics) Executed(t fwk.APICallType, err error, elapsed time.Duration) {
	result := schedmetrics.GoroutineResultSuccess
	if err != nil {
		result = schedmetrics.GoroutineResultError
	}
	schedmetrics.AsyncAPICallsTotal.WithLabelValues(string(t), result).Inc()
	schedmetrics.AsyncAPICallDuration.WithLabelValues(string(t), result).Observe(elapsed.Seconds())
}

func (schedMetrics) Pending(t fwk.APICallType, n int) {
	schedmetrics.AsyncAPIPendingCalls.WithLabelValues(string(t)).Set(float64(n))
}

// heldCall is a schedCall whose execution waits for held to close, after
// closing started.
type heldCall struct {
	schedCall
	started, held chan struct{}
}

func (c *heldCall) Execute(context.Context, clientset.Interface) error {
	close(c.started)
	<-c.held
	return nil
}

// TestCoreAdderTellsEveryAdd pins what runAdder counts on: the core row
// tells every add a result, an add that joined a pending call for the
// same pod included (errJoined), so that an adder never waits for one
// that never comes.
func TestCoreAdderTellsEveryAdd(t *testing.T) {
	// In a bubble, so that an add left without a result fails the test at
	// once (every goroutine blocked) instead of hanging it.
	synctest.Test(t, func(t *testing.T) {
		a := newCoreAdder(t, instantClient(), dropinConfig)
		fin := make(chan error, adderWindow)
		first := &heldCall{schedCall: *newSchedCall(1), started: make(chan struct{}), held: make(chan struct{})}
		add := func(c fwk.APICall) {
			t.Helper()
			if err := a.add(c, fin); err != nil {
				t.Fatal(err)
			}
		}
		add(first)
		<-first.started
		// The pod's call runs: the next add waits behind it, and the one
		// after joins that one.
		add(newFreeCall(1))
		add(newFreeCall(1))
		close(first.held)
		heard := map[error]int{}
		for range 3 {
			heard[<-fin]++
		}
		a.close()
		if heard[nil] != 2 || heard[errJoined] != 1 || len(heard) != 2 {
			t.Fatalf("the three adds heard %v, want nil twice and errJoined once", heard)
		}
	})
}
