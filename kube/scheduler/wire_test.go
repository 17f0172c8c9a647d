package scheduler

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/retry"
	fwk "k8s.io/kube-scheduler/framework"
)

// server is a pods API on an httptest server: it answers status patches,
// bindings and gets, records each request's arrival, and lets a test
// answer a request itself.
type server struct {
	srv *httptest.Server

	mu      sync.Mutex
	log     []arrival
	waiters []waiter
	respond func(w http.ResponseWriter, r *http.Request, a arrival) bool
}

// waiter is a channel to close once n requests of kind have arrived.
type waiter struct {
	kind string
	n    int
	ch   chan struct{}
}

// reached returns a channel closed once n requests of kind have arrived.
// The wire tests run on real time against a real HTTP server (synctest
// cannot hold network I/O), so they wait on the server's own events.
func (s *server) reached(kind string, n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := waiter{kind: kind, n: n, ch: make(chan struct{})}
	s.waiters = append(s.waiters, w)
	s.wake()
	return w.ch
}

// wake closes the channels of the waiters whose count is reached.
func (s *server) wake() {
	kept := s.waiters[:0]
	for _, w := range s.waiters {
		n := 0
		for _, a := range s.log {
			if a.kind == w.kind {
				n++
			}
		}
		if n >= w.n {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	s.waiters = kept
}

// arrival is one request as the server saw it.
type arrival struct {
	kind    string // "patch", "bind", "get"
	pod     string
	at      time.Time
	retryOf int // how many earlier requests of this kind the pod had
	wire    request
}

// request is what a client decides about a request: all of it but the
// host, and the body, whose encoding Content-Type names.
type request struct {
	Method, URI                    string // URI: path and query
	ContentType, Accept, UserAgent string
	Authorization                  string
}

func newServer(t *testing.T) *server {
	s := &server{}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/") // api v1 namespaces NS pods NAME [sub]
	a := arrival{kind: "get", at: time.Now(), wire: request{
		Method:        r.Method,
		URI:           r.URL.RequestURI(),
		ContentType:   r.Header.Get("Content-Type"),
		Accept:        r.Header.Get("Accept"),
		UserAgent:     r.Header.Get("User-Agent"),
		Authorization: r.Header.Get("Authorization"),
	}}
	if len(parts) >= 6 {
		a.pod = parts[5]
	}
	switch {
	case r.Method == http.MethodPatch:
		a.kind = "patch"
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/binding"):
		a.kind = "bind"
	}
	s.mu.Lock()
	for _, b := range s.log {
		if b.kind == a.kind && b.pod == a.pod {
			a.retryOf++
		}
	}
	s.log = append(s.log, a)
	s.wake()
	respond := s.respond
	s.mu.Unlock()
	if respond != nil && respond(w, r, a) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if a.kind == "bind" {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Success","code":201}`)
		return
	}
	fmt.Fprintf(w, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":"default"}}`, a.pod)
}

func (s *server) arrivals() []arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// count returns how many requests of kind have arrived.
func (s *server) count(kind string) int {
	n := 0
	for _, a := range s.arrivals() {
		if a.kind == kind {
			n++
		}
	}
	return n
}

// client returns a clientset as kube-scheduler builds one: with client-go's
// token bucket of qps and burst, a bearer token and a user agent.
func (s *server) client(t *testing.T, qps float32, burst int) *kubernetes.Clientset {
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: s.srv.URL, QPS: qps, Burst: burst, BearerToken: "secret", UserAgent: "kube-scheduler/test"})
	require.NoError(t, err)
	return cs
}

// restCall is an fwk.APICall that makes real requests, as upstream's do:
// a status patch, with upstream's retry inside Execute on 5xx (at most
// retry.DefaultBackoff.Steps requests), or a binding.
type restCall struct {
	typ fwk.APICallType
	pod string
}

func (c *restCall) CallType() fwk.APICallType                   { return c.typ }
func (c *restCall) UID() types.UID                              { return types.UID(c.pod) }
func (c *restCall) Merge(fwk.APICall) error                     { return nil }
func (c *restCall) IsNoOp() bool                                { return false }
func (c *restCall) Sync(o metav1.Object) (metav1.Object, error) { return o, nil }

func (c *restCall) Execute(ctx context.Context, client kubernetes.Interface) error {
	pods := client.CoreV1().Pods("default")
	if c.typ == podBinding {
		return pods.Bind(ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: c.pod, Namespace: "default"}, Target: v1.ObjectReference{Kind: "Node", Name: "n"}}, metav1.CreateOptions{})
	}
	return retry.OnError(retry.DefaultBackoff, apierrors.IsServiceUnavailable, func() error {
		_, err := pods.Patch(ctx, c.pod, types.StrategicMergePatchType, []byte(`{"status":{}}`), metav1.PatchOptions{}, "status")
		return err
	})
}

// upstreamLike runs each call on its own goroutine through client, as
// upstream's dispatcher does (since kubernetes#134154).
func upstreamLike(client kubernetes.Interface, calls []fwk.APICall) (wait func()) {
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() { _ = c.Execute(context.Background(), client) })
	}
	return wg.Wait
}

func startDispatcher(t *testing.T, client kubernetes.Interface, o Options) *Dispatcher {
	d, err := New(client, fwk.APICallRelevances{podStatusPatch: 1, podBinding: 2}, o)
	require.NoError(t, err)
	d.Start(testLogger(t))
	t.Cleanup(func() { d.Close(canceled()) })
	return d
}

// TestWireDerivesClient: calls run on a clientset derived from the given
// one — same server, credentials and user agent — without a bucket of
// its own; a fake clientset, or a wrapper, is used as it is.
func TestWireDerivesClient(t *testing.T) {
	s := newServer(t)
	cs := s.client(t, 50, 100)
	d := startDispatcher(t, cs, Options{})
	require.True(t, d.wire.metered, d.wire.why)
	tk, err := d.Submit(&restCall{typ: podBinding, pod: "p"}, fwk.APICallOptions{})
	require.NoError(t, err)
	res, err := tk.Wait(t.Context())
	require.NoError(t, err)
	require.NoError(t, res.Err)
	got := s.arrivals()
	require.Len(t, got, 1)
	assert.Equal(t, "Bearer secret", got[0].wire.Authorization)
	assert.Equal(t, "kube-scheduler/test", got[0].wire.UserAgent)
	assert.Nil(t, d.wire.client.CoreV1().RESTClient().(*rest.RESTClient).GetRateLimiter(), "the derived client has no bucket")

	prefixed, err := kubernetes.NewForConfig(&rest.Config{Host: s.srv.URL + "/some/prefix", QPS: -1})
	require.NoError(t, err)
	host, ok := hostOf(prefixed.CoreV1().RESTClient().(*rest.RESTClient))
	require.True(t, ok)
	assert.Equal(t, s.srv.URL+"/some/prefix", host)

	for name, client := range map[string]kubernetes.Interface{
		"fake":    fake.NewClientset(),
		"wrapper": wrapped{cs},
	} {
		t.Run(name, func(t *testing.T) {
			d := startDispatcher(t, client, Options{})
			assert.False(t, d.wire.metered)
			assert.NotEmpty(t, d.wire.why)
			assert.Equal(t, client, d.wire.client, "used as it is")
		})
	}
}

// TestWireKeepsClientSettings: the derived clientset sends what the given
// one sends — the same method, path and query (client-go puts the HTTP
// client's timeout there), Content-Type, Accept, User-Agent and
// credentials — for a binding and a status patch, whatever content type
// the given clientset was configured with (kube-scheduler's speaks
// protobuf); only its limiter is gone.
func TestWireKeepsClientSettings(t *testing.T) {
	const protobuf = "application/vnd.kubernetes.protobuf"
	for name, cfg := range map[string]rest.Config{
		"defaults":                      {},
		"protobuf, as kube-scheduler's": {ContentConfig: rest.ContentConfig{ContentType: protobuf}},
		"protobuf, accepting JSON too":  {ContentConfig: rest.ContentConfig{ContentType: protobuf, AcceptContentTypes: protobuf + ",application/json"}},
		"timeout":                       {Timeout: 42 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			calls := func() []*restCall {
				return []*restCall{{typ: podBinding, pod: "p"}, {typ: podStatusPatch, pod: "q"}}
			}
			// newClient returns the given clientset, as a scheduler builds it,
			// and the server it talks to.
			newClient := func() (*server, kubernetes.Interface) {
				s := newServer(t)
				c := cfg
				c.Host, c.BearerToken, c.UserAgent, c.QPS, c.Burst = s.srv.URL, "secret", "kube-scheduler/headers", 50, 100
				cs, err := kubernetes.NewForConfig(&c)
				require.NoError(t, err)
				return s, cs
			}
			sent := func(s *server) []request {
				var out []request
				for _, a := range s.arrivals() {
					out = append(out, a.wire)
				}
				return out
			}

			direct, cs := newClient()
			for _, c := range calls() {
				require.NoError(t, c.Execute(t.Context(), cs))
			}

			dispatched, cs := newClient()
			d := startDispatcher(t, cs, Options{})
			require.True(t, d.wire.metered, "the client was not unwrapped: %s", d.wire.why)
			for _, c := range calls() {
				tk, err := d.Submit(c, fwk.APICallOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				require.NoError(t, res.Err)
			}

			want := sent(direct)
			require.Len(t, want, 2)
			assert.Equal(t, want, sent(dispatched))
		})
	}
}

// wrapped is a clientset wrapper whose CoreV1 REST client is not a
// *rest.RESTClient.
type wrapped struct{ kubernetes.Interface }

func (w wrapped) CoreV1() corev1.CoreV1Interface { return wrappedCore{w.Interface.CoreV1()} }

type wrappedCore struct{ corev1.CoreV1Interface }

func (wrappedCore) RESTClient() rest.Interface { return nil }

// TestBindingWaitsForOneToken is kubernetes#135900 on the wire: with the
// scheduler's clientset limited to 20 qps (burst 1) and a storm of 60
// status patches queued, a binding added mid-storm reaches the server with
// at most one patch arriving in between — the one whose token was already
// granted — where upstream's goroutine per call through the same client
// puts it behind every patch already waiting in the bucket.
func TestBindingWaitsForOneToken(t *testing.T) {
	const (
		patches = 60
		qps     = 20
	)
	storm := func() []fwk.APICall {
		var calls []fwk.APICall
		for i := range patches {
			calls = append(calls, &restCall{typ: podStatusPatch, pod: fmt.Sprint("pod", i)})
		}
		return calls
	}
	// between counts the patches that reached the server after the
	// binding was added and before the binding did.
	between := func(s *server, added time.Time) int {
		n := 0
		for _, a := range s.arrivals() {
			if a.kind == "bind" {
				return n
			}
			if a.kind == "patch" && a.at.After(added) {
				n++
			}
		}
		return -1
	}

	t.Run("dispatch", func(t *testing.T) {
		s := newServer(t)
		d := startDispatcher(t, s.client(t, qps, 1), Options{Workers: 4})
		for _, c := range storm() {
			require.NoError(t, d.Add(c, fwk.APICallOptions{}))
		}
		<-s.reached("patch", 5)
		added := time.Now()
		ch := make(chan error, 1)
		require.NoError(t, d.Add(&restCall{typ: podBinding, pod: "bound"}, fwk.APICallOptions{OnFinish: ch}))
		require.NoError(t, outcome(t, ch))
		n := between(s, added)
		t.Logf("patches between the binding's Add and its request: %d (of %d queued)", n, patches)
		assert.LessOrEqual(t, n, 1)
		assert.Less(t, s.count("patch"), patches-20, "the storm was far from drained")
	})
	t.Run("upstream's goroutine per call", func(t *testing.T) {
		s := newServer(t)
		client := s.client(t, qps, 1)
		wait := upstreamLike(client, storm())
		<-s.reached("patch", 5)
		added := time.Now()
		wait2 := upstreamLike(client, []fwk.APICall{&restCall{typ: podBinding, pod: "bound"}})
		wait2()
		n := between(s, added)
		t.Logf("patches between the binding's Add and its request: %d (of %d queued)", n, patches)
		assert.Greater(t, n, patches/2, "the binding waited for the storm")
		wait()
	})
}

// TestRateAsConfigured: every request — a call's first, whose token the
// gate took before choosing it, its retries inside Execute, and the
// requests of others sharing the clientset (informers) — takes one token
// of the clientset's bucket: the bucket grants exactly one token per
// request the server sees (and at most one more, which the dispatcher may
// hold for a call that did not come), and the server never sees more than
// burst + qps×T requests in any span T, as with upstream's dispatcher,
// however the load is made up.
func TestRateAsConfigured(t *testing.T) {
	const (
		qps   = 100
		burst = 5
		calls = 60
	)
	s := newServer(t)
	// Every third status patch is answered 503 once: upstream's retry
	// inside Execute sends it again.
	s.respond = func(w http.ResponseWriter, r *http.Request, a arrival) bool {
		var i int
		if n, _ := fmt.Sscanf(a.pod, "pod%d", &i); a.kind == "patch" && a.retryOf == 0 && n == 1 && i%3 == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`)
			return true
		}
		return false
	}
	bucket := &grantCounter{RateLimiter: flowcontrol.NewTokenBucketRateLimiter(qps, burst)}
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: s.srv.URL, RateLimiter: bucket})
	require.NoError(t, err)
	d := startDispatcher(t, cs, Options{Workers: 8})
	done := make(chan struct{})
	var informer sync.WaitGroup
	informer.Go(func() { // another user of the same clientset
		for {
			select {
			case <-done:
				return
			default:
			}
			_, _ = cs.CoreV1().Pods("default").Get(context.Background(), "informer", metav1.GetOptions{})
		}
	})
	var chans []chan error
	for i := range calls {
		typ := podStatusPatch
		if i%10 == 9 {
			typ = podBinding
		}
		ch := make(chan error, 1)
		chans = append(chans, ch)
		require.NoError(t, d.Add(&restCall{typ: typ, pod: fmt.Sprint("pod", i)}, fwk.APICallOptions{OnFinish: ch}))
	}
	for _, ch := range chans {
		require.NoError(t, outcome(t, ch))
	}
	close(done)
	informer.Wait()

	got := s.arrivals()
	require.Greater(t, len(got), calls+calls/3-calls/30, "the 503s were retried inside Execute")
	var at []time.Time
	for _, a := range got {
		at = append(at, a.at)
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	// Each request paid once: the bucket's grants, counted where they are
	// made, exactly (no clock involved).
	granted := int(bucket.granted.Load())
	assert.GreaterOrEqual(t, granted, len(at), "requests the server saw without a token of the clientset's bucket")
	assert.LessOrEqual(t, granted, len(at)+1, "tokens taken from the bucket for no request (one may be held for a call that did not come)")
	// And the pace the server saw: a token bucket lets burst + qps×T
	// requests through in any span T. The server stamps arrivals, which
	// scheduling jitter on a loaded machine (the race detector, CI's other
	// packages) can bunch by several milliseconds — a first request late by
	// 7ms shortened a whole run's span once — so spans are judged with
	// three requests of slack (30ms at this rate); the count above is the
	// exact check.
	span := at[len(at)-1].Sub(at[0])
	worst := 0.0
	for i := range at {
		for j := i + 1; j < len(at); j++ {
			if at[j].Sub(at[i]) < 100*time.Millisecond {
				continue
			}
			allowed := burst + qps*at[j].Sub(at[i]).Seconds()
			worst = max(worst, float64(j-i+1)-allowed)
		}
	}
	t.Logf("%d requests in %v; the most a span of 100ms or more exceeded burst + qps×T by: %.2f", len(at), span, worst)
	assert.LessOrEqual(t, worst, 3.0, "the server saw more than the clientset's bucket allows")
}

// grantCounter counts the tokens a client-go rate limiter grants through
// Wait, which is how client-go and the adapter take them (a token taken
// another way would show as a request without a grant).
type grantCounter struct {
	flowcontrol.RateLimiter
	granted atomic.Int64
}

func (g *grantCounter) Wait(ctx context.Context) error {
	err := g.RateLimiter.Wait(ctx)
	if err == nil {
		g.granted.Add(1)
	}
	return err
}

// TestRetryAfterInTheQueue: a 429 with Retry-After comes back from Execute
// at once (client-go's own retry loop, which would sleep it out inside the
// worker up to ten times, is off) and the dispatcher waits the server's
// delay out in its queue before the next attempt.
func TestRetryAfterInTheQueue(t *testing.T) {
	s := newServer(t)
	s.respond = func(w http.ResponseWriter, r *http.Request, a arrival) bool {
		if a.retryOf == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, "Too many requests, please try again later.")
			return true
		}
		return false
	}
	d := startDispatcher(t, s.client(t, 50, 100), Options{})
	tk, err := d.Submit(&restCall{typ: podBinding, pod: "p"}, fwk.APICallOptions{})
	require.NoError(t, err)
	res, err := tk.Wait(t.Context())
	require.NoError(t, err)
	require.NoError(t, res.Err)
	assert.Equal(t, 2, res.Outcome.Attempts, "one request per execution")
	got := s.arrivals()
	require.Len(t, got, 2)
	assert.GreaterOrEqual(t, got[1].at.Sub(got[0].at), time.Second, "the server's delay was honoured")
	assert.Equal(t, uint64(1), d.Stats().Retries)
}
