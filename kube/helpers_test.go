package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"
)

// request is one request the fake API server received.
type request struct {
	Verb string // get, patch, create, delete
	Sub  string // "", status, binding
	Name string
	N    int // 1 for the first request of this Verb and Sub, and so on
	Body string
	At   time.Time
}

func (r request) kind() string { return r.Verb + "/" + r.Sub }

// fault decides a request's fate before the server handles it: the error to
// answer with, and whether the server applies the request all the same (a
// lost response: the write happened, the client hears an error). It runs
// under the server's lock and must not block.
type fault func(r request) (apply bool, err error)

// fakeAPI is a pod API server for tests: k8s.io/client-go/kubernetes/fake
// with reactors that give pods the server's semantics the calls rely on —
// resourceVersions bumped on every write and checked as a patch's
// precondition, a binding refused with 409 once the pod is assigned (and it
// sets PodScheduled=True, as kube-apiserver does), a deletion's UID
// precondition — plus faults and latency.
//
// Latency is injected around the fake clientset, not in a reactor: the
// fake runs its reactor chain under one lock, so a sleeping reactor would
// serialize every request, where a real server serves them concurrently.
type fakeAPI struct {
	cs      *fake.Clientset
	latency time.Duration

	mu       sync.Mutex
	store    *podStore
	log      []request
	counts   map[string]int
	fault    fault
	inFlight map[string]int // by Verb/Sub, with latency
	// onStart, if set, sees each request as it starts, with the requests
	// in flight, under the server's lock.
	onStart func(kind, name string, inFlight map[string]int)
	// gate, if set, runs as each request starts, outside every lock: it
	// may block to hold the request.
	gate func(kind, name string)
}

func newFakeAPI(pods ...*v1.Pod) *fakeAPI {
	a := &fakeAPI{
		cs:       fake.NewClientset(),
		store:    newPodStore(),
		counts:   map[string]int{},
		inFlight: map[string]int{},
	}
	for _, p := range pods {
		a.add(p)
	}
	a.cs.PrependReactor("*", "pods", a.react)
	return a
}

// client is the clientset the dispatcher gets: the fake, with latency.
func (a *fakeAPI) client() kubernetes.Interface { return slowClient{a.cs, a} }

// add stores a copy of pod with a fresh resourceVersion and returns it.
func (a *fakeAPI) add(pod *v1.Pod) *v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.store.add(pod)
}

// pod returns a copy of the stored pod, or nil.
func (a *fakeAPI) pod(name string) *v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, _ := a.store.get(name)
	return p
}

// change changes pod name on the server as another writer would (a new
// resourceVersion), and returns the pod as an informer would then deliver
// it.
func (a *fakeAPI) change(name string, f func(p *v1.Pod)) *v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.store.pods[name]
	f(p)
	a.store.bump(p)
	return p.DeepCopy()
}

func (a *fakeAPI) setFault(f fault) {
	a.mu.Lock()
	a.fault = f
	a.mu.Unlock()
}

// count returns how many requests of kind verb/sub the server received.
func (a *fakeAPI) count(kind string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counts[kind]
}

// requests returns the requests received, in order.
func (a *fakeAPI) requests() []request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]request(nil), a.log...)
}

// react serves every pods request that reaches the fake clientset.
func (a *fakeAPI) react(action clienttesting.Action) (bool, runtime.Object, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := request{Verb: action.GetVerb(), Sub: action.GetSubresource(), At: time.Now()}
	switch act := action.(type) {
	case clienttesting.GetActionImpl:
		r.Name = act.GetName()
	case clienttesting.PatchActionImpl:
		r.Name, r.Body = act.GetName(), string(act.GetPatch())
	case clienttesting.CreateActionImpl:
		if b, ok := act.GetObject().(*v1.Binding); ok {
			r.Name = b.Name
			r.Body = b.Target.Name
		}
	case clienttesting.DeleteActionImpl:
		r.Name = act.GetName()
	}
	a.counts[r.kind()]++
	r.N = a.counts[r.kind()]
	a.log = append(a.log, r)
	var err error
	apply := true
	if a.fault != nil {
		if apply, err = a.fault(r); err == nil {
			apply = true
		}
	}
	if !apply {
		return true, nil, err
	}
	obj, serr := a.serve(action, r)
	if err != nil {
		return true, nil, err
	}
	return true, obj, serr
}

// serve applies a request as kube-apiserver would. a.mu is held.
func (a *fakeAPI) serve(action clienttesting.Action, r request) (runtime.Object, error) {
	switch act := action.(type) {
	case clienttesting.GetActionImpl:
		return a.store.get(r.Name)
	case clienttesting.PatchActionImpl:
		return a.store.patchStatus(r.Name, act.GetPatch())
	case clienttesting.CreateActionImpl:
		return nil, a.store.bind(act.GetObject().(*v1.Binding))
	case clienttesting.DeleteActionImpl:
		var uid *types.UID
		if pre := act.GetDeleteOptions().Preconditions; pre != nil {
			uid = pre.UID
		}
		_, err := a.store.delete(r.Name, uid)
		return nil, err
	}
	return nil, apierrors.NewMethodNotSupported(podsResource, r.Verb)
}

// enter and leave track requests in flight (outside the fake's lock).
func (a *fakeAPI) enter(kind, name string) {
	a.mu.Lock()
	a.inFlight[kind]++
	if a.onStart != nil {
		a.onStart(kind, name, a.inFlight)
	}
	gate := a.gate
	a.mu.Unlock()
	if gate != nil {
		gate(kind, name)
	}
	time.Sleep(a.latency)
}

func (a *fakeAPI) leave(kind string) {
	a.mu.Lock()
	a.inFlight[kind]--
	a.mu.Unlock()
}

// slowClient adds the fake API's latency to every pod request. Its
// CoreV1().RESTClient() is the fake's (a nil *rest.RESTClient), so the
// adapter uses the typed methods.
type slowClient struct {
	*fake.Clientset
	a *fakeAPI
}

func (c slowClient) CoreV1() corev1.CoreV1Interface {
	return slowCore{c.Clientset.CoreV1(), c.a}
}

type slowCore struct {
	corev1.CoreV1Interface
	a *fakeAPI
}

func (c slowCore) Pods(namespace string) corev1.PodInterface {
	return slowPods{c.CoreV1Interface.Pods(namespace), c.a}
}

type slowPods struct {
	corev1.PodInterface
	a *fakeAPI
}

func (p slowPods) Get(ctx context.Context, name string, o metav1.GetOptions) (*v1.Pod, error) {
	p.a.enter("get/", name)
	defer p.a.leave("get/")
	return p.PodInterface.Get(ctx, name, o)
}

func (p slowPods) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, o metav1.PatchOptions, sub ...string) (*v1.Pod, error) {
	p.a.enter("patch/status", name)
	defer p.a.leave("patch/status")
	return p.PodInterface.Patch(ctx, name, pt, data, o, sub...)
}

func (p slowPods) Bind(ctx context.Context, b *v1.Binding, o metav1.CreateOptions) error {
	p.a.enter("create/binding", b.Name)
	defer p.a.leave("create/binding")
	return p.PodInterface.Bind(ctx, b, o)
}

func (p slowPods) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	p.a.enter("delete/", name)
	defer p.a.leave("delete/")
	return p.PodInterface.Delete(ctx, name, o)
}

// newTestDispatcher makes a dispatcher on api with o, and closes it (and
// checks conservation) when the test ends.
func newTestDispatcher(t *testing.T, api *fakeAPI, o Options) *Dispatcher {
	t.Helper()
	d, err := NewDispatcher(api.client(), o)
	require.NoError(t, err)
	t.Cleanup(func() { closeD(t, d) })
	return d
}

// closeD closes d (idempotent) and checks that every submission was
// accounted for.
func closeD(t *testing.T, d *Dispatcher) dispatch.Stats {
	t.Helper()
	require.NoError(t, d.Close(context.Background()))
	s := d.Stats()
	assert.Equal(t, s.Submitted, s.Rejected+total(s.Outcomes)+uint64(s.Live), "conservation")
	assert.Zero(t, s.Live)
	return s
}

// outcome waits for t's result.
func outcome(t *testing.T, tk *dispatch.Ticket[types.UID, Call]) dispatch.Result[types.UID, Call] {
	t.Helper()
	r, _ := tk.Wait(context.Background())
	return r
}

func submit(t *testing.T, d *Dispatcher, c Call) *dispatch.Ticket[types.UID, Call] {
	t.Helper()
	tk, err := d.Submit(context.Background(), c, dispatch.SubmitOptions{})
	require.NoError(t, err)
	return tk
}

// hold makes the fake API hold every request of kind (verb/subresource)
// for pod name until release is called.
func (a *fakeAPI) hold(kind, name string) (release func()) {
	ch := make(chan struct{})
	a.mu.Lock()
	a.gate = func(k, n string) {
		if k == kind && n == name {
			<-ch
		}
	}
	a.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// total sums Stats.Outcomes or Stats.Calls.
func total(c map[dispatch.State]uint64) uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}
