package apidispatcher

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	upstream "k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher"
	apicalls "k8s.io/kubernetes/pkg/scheduler/framework/api_calls"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog's flush daemon, started by the scheduler's packages' init.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

// dispatcher is the API both packages export.
type dispatcher interface {
	Add(fwk.APICall, fwk.APICallOptions) error
	SyncObject(metav1.Object) (metav1.Object, error)
	Close()
}

var (
	_ fwk.APIDispatcher = (*APIDispatcher)(nil)
	_ dispatcher        = (*APIDispatcher)(nil)
	_ dispatcher        = (*upstream.APIDispatcher)(nil)
)

// TestSameAPIAsUpstream: the package exports exactly what upstream's
// exports — the same names, New with the same signature, the same methods
// with the same signatures — so code written against upstream's package
// compiles against this one unchanged.
func TestSameAPIAsUpstream(t *testing.T) {
	assert.Equal(t, exportedNames(t, upstreamDir(t)), exportedNames(t, "."))
	assert.Equal(t, reflect.TypeOf(upstream.New).String(), reflect.TypeOf(New).String())
	assert.Equal(t, methods(reflect.TypeOf(&upstream.APIDispatcher{})), methods(reflect.TypeOf(&APIDispatcher{})))
}

func upstreamDir(t *testing.T) string {
	p, err := build.Import("k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher", ".", build.FindOnly)
	require.NoError(t, err)
	return p.Dir
}

// exportedNames lists the exported top-level names of the non-test files
// in dir, with the methods as Type.Method.
func exportedNames(t *testing.T, dir string) []string {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				name := d.Name.Name
				if d.Recv != nil {
					recv := d.Recv.List[0].Type
					if s, ok := recv.(*ast.StarExpr); ok {
						recv = s.X
					}
					if !recv.(*ast.Ident).IsExported() {
						continue
					}
					name = recv.(*ast.Ident).Name + "." + name
				}
				names = append(names, name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

func methods(typ reflect.Type) []string {
	var out []string
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		out = append(out, m.Name+" "+m.Type.String())
	}
	return out
}

func enableAsyncAPICalls(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.SchedulerAsyncAPICalls, true)
	metrics.Register()
	metrics.AsyncAPICallsTotal.Reset()
	metrics.AsyncAPICallDuration.Reset()
	metrics.AsyncAPIPendingCalls.Reset()
}

func testPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
}

// TestUpstreamCalls runs upstream's own calls through the drop-in, on the
// fake clientset: a status patch that a binding overwrites, a binding, and
// a status patch; the outcomes, what reached the API, and kube-scheduler's
// metrics, recorded as upstream records them.
func TestUpstreamCalls(t *testing.T) {
	enableAsyncAPICalls(t)
	logger, _ := ktesting.NewTestContext(t)
	a, b := testPod("a"), testPod("b")
	client := fake.NewClientset(a, b)
	d := New(client, 16, apicalls.Relevances)
	defer d.Close()

	cond := &v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable}
	overwritten, bound, patched := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	require.NoError(t, d.Add(apicalls.Implementations.PodStatusPatch(a, []*v1.PodCondition{cond}, nil), fwk.APICallOptions{OnFinish: overwritten}))
	require.NoError(t, d.Add(apicalls.Implementations.PodBinding(&v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "default", UID: a.UID},
		Target:     v1.ObjectReference{Kind: "Node", Name: "node-1"},
	}), fwk.APICallOptions{OnFinish: bound}))
	require.NoError(t, d.Add(apicalls.Implementations.PodStatusPatch(b, []*v1.PodCondition{cond}, nil), fwk.APICallOptions{OnFinish: patched}))
	expectOnFinish(t, overwritten, fwk.ErrCallOverwritten)
	testutil.AssertVectorCount(t, "scheduler_pending_async_api_calls", map[string]string{"call_type": "pod_binding"}, 0) // not reported before Run

	d.Run(logger)
	require.NoError(t, <-bound)
	require.NoError(t, <-patched)
	var verbs []string
	for _, act := range client.Actions() {
		verbs = append(verbs, act.GetVerb()+" "+act.GetResource().Resource+"/"+act.GetSubresource())
	}
	assert.ElementsMatch(t, []string{"create pods/binding", "patch pods/status"}, verbs)
	got, err := client.CoreV1().Pods("default").Get(t.Context(), "b", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, got.Status.Conditions, 1)
	assert.Equal(t, v1.PodReasonUnschedulable, got.Status.Conditions[0].Reason)

	testutil.AssertVectorCount(t, "scheduler_async_api_call_execution_total", map[string]string{"call_type": "pod_binding", "result": "success"}, 1)
	testutil.AssertVectorCount(t, "scheduler_async_api_call_execution_total", map[string]string{"call_type": "pod_status_patch", "result": "success"}, 1)
	testutil.AssertHistogramTotalCount(t, "scheduler_async_api_call_execution_duration_seconds", map[string]string{"call_type": "pod_binding", "result": "success"}, 1)
	d.Close() // the last pending-calls report happens by Close
	for _, typ := range []string{"pod_binding", "pod_status_patch"} {
		v, err := testutil.GetGaugeMetricValue(metrics.AsyncAPIPendingCalls.WithLabelValues(typ))
		require.NoError(t, err)
		assert.Zero(t, v, typ)
	}
}

// apiServer answers pods' status patches and bindings, and counts them;
// respond, if set, may answer first.
type apiServer struct {
	srv     *httptest.Server
	mu      sync.Mutex
	arrived []string // "patch NAME" or "bind NAME", in order
	waiters map[int]chan struct{}
	respond func(w http.ResponseWriter, r *http.Request) bool
}

// reached returns a channel closed once n requests have arrived.
func (s *apiServer) reached(n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if len(s.arrived) >= n {
		close(ch)
		return ch
	}
	if s.waiters == nil {
		s.waiters = map[int]chan struct{}{}
	}
	s.waiters[n] = ch
	return ch
}

func newAPIServer(t *testing.T, respond func(http.ResponseWriter, *http.Request) bool) *apiServer {
	s := &apiServer{respond: respond}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		kind := "patch"
		if r.Method == http.MethodPost {
			kind = "bind"
		}
		s.mu.Lock()
		s.arrived = append(s.arrived, kind+" "+parts[len(parts)-2])
		if ch, ok := s.waiters[len(s.arrived)]; ok {
			close(ch)
			delete(s.waiters, len(s.arrived))
		}
		s.mu.Unlock()
		if s.respond != nil && s.respond(w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if kind == "bind" {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Success","code":201}`)
			return
		}
		fmt.Fprintf(w, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":"default"}}`, parts[len(parts)-2])
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *apiServer) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.arrived)
}

func (s *apiServer) client(t *testing.T, qps float32, burst int) clientset.Interface {
	cs, err := clientset.NewForConfig(&rest.Config{Host: s.srv.URL, QPS: qps, Burst: burst})
	require.NoError(t, err)
	return cs
}

func unschedulable(pod *v1.Pod) fwk.APICall {
	return apicalls.Implementations.PodStatusPatch(pod, []*v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable}}, nil)
}

// TestStatusPatchRequestsBounded: upstream's PodStatusPatchCall retries
// inside Execute (retry.DefaultBackoff: 4 requests) on a 503, and the
// dispatcher retries the call (3 attempts): a status patch the server
// keeps refusing makes exactly 3 × 4 = 12 requests. A 429 with Retry-After,
// which client-go would resend ten more times inside each request, makes
// one request per attempt: 3.
func TestStatusPatchRequestsBounded(t *testing.T) {
	enableAsyncAPICalls(t)
	for _, tc := range []struct {
		name     string
		status   int
		header   string
		requests int
	}{
		{"503", http.StatusServiceUnavailable, "", 12},
		{"429 with Retry-After", http.StatusTooManyRequests, "0", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newAPIServer(t, func(w http.ResponseWriter, r *http.Request) bool {
				if tc.header != "" {
					w.Header().Set("Retry-After", tc.header)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}`, tc.status)
				return true
			})
			logger, _ := ktesting.NewTestContext(t)
			d := New(s.client(t, 1000, 1000), 16, apicalls.Relevances)
			d.Run(logger)
			defer d.Close()
			ch := make(chan error, 1)
			require.NoError(t, d.Add(unschedulable(testPod("a")), fwk.APICallOptions{OnFinish: ch}))
			require.Error(t, receive(t, ch, "the status patch's outcome"))
			assert.Len(t, s.list(), tc.requests)
		})
	}
}

// TestBindingNotBehindStorm is kubernetes#135900 with upstream's own calls
// and clientset limits (20 qps, burst 1, as the bucket of a scheduler under
// a storm): 60 status patches are added, then a binding. Through the
// drop-in the binding reaches the server with at most one patch in
// between; through upstream's package, behind most of the storm.
func TestBindingNotBehindStorm(t *testing.T) {
	enableAsyncAPICalls(t)
	const patches = 60
	run := func(t *testing.T, newDispatcher func(clientset.Interface) (dispatcher, func(logger klog.Logger))) int {
		s := newAPIServer(t, nil)
		d, run := newDispatcher(s.client(t, 20, 1))
		defer d.Close()
		logger, _ := ktesting.NewTestContext(t)
		run(logger)
		for i := range patches {
			require.NoError(t, d.Add(unschedulable(testPod(fmt.Sprint("p", i))), fwk.APICallOptions{}))
		}
		<-s.reached(5)
		before := len(s.list())
		ch := make(chan error, 1)
		require.NoError(t, d.Add(apicalls.Implementations.PodBinding(&v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: "bound", Namespace: "default", UID: "uid-bound"},
			Target:     v1.ObjectReference{Kind: "Node", Name: "node-1"},
		}), fwk.APICallOptions{OnFinish: ch}))
		select {
		case err := <-ch:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("the binding did not finish")
		}
		at := slices.Index(s.list(), "bind bound")
		require.GreaterOrEqual(t, at, 0)
		t.Logf("status patches that reached the server after the binding was added, before it: %d of %d", at-before, patches)
		return at - before
	}
	ours := run(t, func(cs clientset.Interface) (dispatcher, func(klog.Logger)) {
		d := New(cs, 16, apicalls.Relevances)
		return d, d.Run
	})
	theirs := run(t, func(cs clientset.Interface) (dispatcher, func(klog.Logger)) {
		d := upstream.New(cs, 16, apicalls.Relevances)
		return d, d.Run
	})
	assert.LessOrEqual(t, ours, 1)
	assert.Greater(t, theirs, patches/2)
}

// TestStatusPatchesPaced: status patches the server does not answer hold
// one worker — the pace's first cap, while no execution time is known yet
// — and a binding added meanwhile reaches the server and is answered; once
// the server answers, every patch finishes, never more at once than the
// workers not kept for bindings.
func TestStatusPatchesPaced(t *testing.T) {
	enableAsyncAPICalls(t)
	release := make(chan struct{})
	var once sync.Once
	answer := func() { once.Do(func() { close(release) }) }
	var inFlight, most atomic.Int32
	capped := make(chan struct{}) // closed once the first patch is held
	var cappedOnce sync.Once
	s := newAPIServer(t, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPatch {
			return false
		}
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		cappedOnce.Do(func() { close(capped) })
		<-release
		inFlight.Add(-1)
		return false
	})
	t.Cleanup(answer) // before the server's Close, which waits for its handlers
	logger, _ := ktesting.NewTestContext(t)
	const workers, notReserved = 16, 12 // a quarter kept for bindings
	d := New(s.client(t, 1000, 1000), workers, apicalls.Relevances)
	d.Run(logger)
	defer func() { answer(); d.Close() }()
	const patches = 20
	done := make(chan error, patches)
	for i := range patches {
		require.NoError(t, d.Add(unschedulable(testPod(fmt.Sprint("p", i))), fwk.APICallOptions{OnFinish: done}))
	}
	receive(t, capped, "the first status patch held at the server")
	bound := make(chan error, 1)
	require.NoError(t, d.Add(apicalls.Implementations.PodBinding(&v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "bound", Namespace: "default", UID: "uid-bound"},
		Target:     v1.ObjectReference{Kind: "Node", Name: "node-1"},
	}), fwk.APICallOptions{OnFinish: bound}))
	require.NoError(t, receive(t, bound, "the binding, while the status patch hangs"))
	assert.Len(t, s.list(), 2, "one patch and the binding reached the server: %v", s.list())
	answer()
	for range patches {
		require.NoError(t, receive(t, done, "a status patch, once the server answers"))
	}
	assert.LessOrEqual(t, most.Load(), int32(notReserved), "the most status patches at the server at once")
}

// receive waits for a value from ch (or its close), failing the test
// after 30 seconds.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("waited 30s for %s", what)
		panic("unreachable")
	}
}
