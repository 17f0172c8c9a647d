package benchmarks

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
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
// relevances), each for a pod of its own, and each executes one request on
// a fake clientset that answers at once. The implementations:
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
//     configure it (coreAsDropin), with none of the adapter's own code.
//
// So the drop-in's cost splits in two: what its configuration costs the
// core (core/dropin-config against core, and dropin/metrics=off against
// dropin/bare) and the adapter's own work per call (dropin/metrics=off
// against core/dropin-config, and dropin/bare against core).
func BenchmarkAPIDispatcher(b *testing.B) {
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
		{"core", func(b *testing.B, c clientset.Interface) adder { return newCoreAdder(b, c, false) }},
		{"core/dropin-config", func(b *testing.B, c clientset.Interface) adder { return newCoreAdder(b, c, true) }},
	} {
		b.Run("impl="+impl.name, func(b *testing.B) {
			a := impl.new(b, instantClient())
			var seq atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				fin := make(chan error, adderWindow)
				out := 0
				for pb.Next() {
					if out == adderWindow {
						if err := <-fin; err != nil {
							b.Error(err)
						}
						out--
					}
					if err := a.add(newSchedCall(seq.Add(1)), fin); err != nil {
						b.Error(err)
						return
					}
					out++
				}
				for ; out > 0; out-- {
					if err := <-fin; err != nil {
						b.Error(err)
					}
				}
			})
			b.StopTimer()
			a.close()
		})
	}
}

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

// The drop-in's documented defaults that coreAsDropin sets in the core
// (kube/scheduler's Options): bindings at priority 20 and status patches
// at 0, in bands of 10; a timeout of five minutes from Add; a quarter of
// the workers kept for the binding's band.
const (
	dropinBindingPriority = 20
	dropinAgingBand       = 10
	dropinTimeout         = 5 * time.Minute
	dropinReserved        = schedulerParallelism / 4
)

// quietObserver is an Observer of no methods of its own, where the
// drop-in's logs its retries, drops and switches: the core delivers its
// events all the same.
type quietObserver struct{ dispatch.NopObserver }

// newCoreAdder Posts the calls to the core. With coreAsDropin it
// configures the core as the drop-in's defaults do: each call's deadline,
// the workers kept for bindings, the aging band, the call types named as
// tenants and as labels, a status patch droppable for a binding at
// capacity, and an observer.
func newCoreAdder(b *testing.B, client clientset.Interface, coreAsDropin bool) adder {
	cfg := dispatch.Config[types.UID, coreCall]{
		Workers:  schedulerParallelism,
		Capacity: 100_000,
		OnDone: func(r dispatch.Result[types.UID, coreCall]) {
			select {
			case r.Call.fin <- r.Err:
			default:
			}
		},
	}
	if coreAsDropin {
		cfg.AgingBand = dropinAgingBand
		cfg.Start = dispatch.StartPolicy{ReservedWorkers: dropinReserved, UrgentPriority: dropinBindingPriority}
		cfg.Label = func(_ types.UID, c coreCall) string { return string(c.call.CallType()) }
		cfg.Tenants = map[string]dispatch.TenantConfig{string(apicalls.PodBinding): {}, string(apicalls.PodStatusPatch): {}}
		cfg.Observer = quietObserver{} // the drop-in always has one: its log lines
	}
	d, err := dispatch.New(func(ctx context.Context, _ types.UID, c coreCall) error {
		return c.call.Execute(ctx, client)
	}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return adder{
		add: func(c fwk.APICall, fin chan<- error) error {
			o := dispatch.SubmitOptions{Tenant: string(c.CallType())}
			if c.CallType() == apicalls.PodBinding {
				o.Priority = dropinBindingPriority
			}
			if coreAsDropin {
				o.Deadline = time.Now().Add(dropinTimeout)
				o.Droppable = o.Priority < dropinBindingPriority
			}
			return d.Post(c.UID(), coreCall{c, fin}, o)
		},
		close: func() {
			if err := d.Close(context.Background()); err != nil {
				b.Error(err)
			}
		},
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
