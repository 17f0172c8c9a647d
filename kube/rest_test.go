package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/internal/retryafter"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// apiServer is a pods API on an httptest server on loopback, reached
// through client-go's real REST stack: transport, request building,
// encoding and error decoding. It keeps the server semantics the calls
// rely on, and answers as kube-apiserver does: Status bodies for API
// errors, plain text with Retry-After for its max-in-flight 429s.
type apiServer struct {
	srv *httptest.Server

	mu    sync.Mutex
	store *podStore
	log   []serverRequest
	// respond, if set, may answer a request itself (returning true) before
	// the pods API does; n counts requests from 1.
	respond func(w http.ResponseWriter, r *http.Request, n int) bool
}

type serverRequest struct {
	Method, Path, Body string
	At                 time.Time
}

func newAPIServer(t *testing.T, pods ...*v1.Pod) *apiServer {
	s := &apiServer{store: newPodStore()}
	for _, p := range pods {
		s.store.add(p)
	}
	mux := http.NewServeMux()
	const pod = "/api/v1/namespaces/{ns}/pods/{name}"
	mux.HandleFunc("GET "+pod, s.get)
	mux.HandleFunc("PATCH "+pod+"/status", s.patch)
	mux.HandleFunc("POST "+pod+"/binding", s.bind)
	mux.HandleFunc("DELETE "+pod, s.delete)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		s.log = append(s.log, serverRequest{r.Method, r.URL.Path, string(body), time.Now()})
		n, respond := len(s.log), s.respond
		s.mu.Unlock()
		if respond != nil && respond(w, r, n) {
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// client returns a clientset for the server, set up as the package
// recommends (RESTConfig: no client-side rate limit).
func (s *apiServer) client(t *testing.T) kubernetes.Interface {
	cs, err := kubernetes.NewForConfig(RESTConfig(&rest.Config{Host: s.srv.URL}))
	require.NoError(t, err)
	return cs
}

func (s *apiServer) requests() []serverRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]serverRequest(nil), s.log...)
}

func (s *apiServer) setRespond(f func(w http.ResponseWriter, r *http.Request, n int) bool) {
	s.mu.Lock()
	s.respond = f
	s.mu.Unlock()
}

func writeJSON(w http.ResponseWriter, code int, obj any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(obj)
}

// writeStatus answers with err's Status, as kube-apiserver does.
func writeStatus(w http.ResponseWriter, err *apierrors.StatusError) {
	st := err.ErrStatus
	st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	if st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(st.Details.RetryAfterSeconds)))
	}
	writeJSON(w, int(st.Code), st)
}

// writeText answers with a plain-text error, as kube-apiserver's
// max-in-flight filter answers 429.
func writeText(w http.ResponseWriter, code, retryAfter int, msg string) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	http.Error(w, msg, code)
}

// answer writes obj, or err as a Status.
func answer(w http.ResponseWriter, code int, obj runtime.Object, err error) {
	var st *apierrors.StatusError
	switch {
	case errors.As(err, &st):
		writeStatus(w, st)
	case err != nil:
		writeStatus(w, apierrors.NewInternalError(err))
	default:
		writeJSON(w, code, obj)
	}
}

func podOut(p *v1.Pod) runtime.Object {
	if p == nil {
		return nil
	}
	p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	return p
}

func (s *apiServer) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.store.get(r.PathValue("name"))
	answer(w, http.StatusOK, podOut(p), err)
}

func (s *apiServer) patch(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	p, err := s.store.patchStatus(r.PathValue("name"), body)
	answer(w, http.StatusOK, podOut(p), err)
}

func (s *apiServer) bind(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b v1.Binding
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		writeStatus(w, apierrors.NewBadRequest(err.Error()))
		return
	}
	b.Name = r.PathValue("name")
	err := s.store.bind(&b)
	answer(w, http.StatusCreated, &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusSuccess, Code: 201}, err)
}

func (s *apiServer) delete(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var opts metav1.DeleteOptions
	_ = json.NewDecoder(r.Body).Decode(&opts)
	var uid *types.UID
	if opts.Preconditions != nil {
		uid = opts.Preconditions.UID
	}
	p, err := s.store.delete(r.PathValue("name"), uid)
	answer(w, http.StatusOK, podOut(p), err)
}

// TestRESTErrors classifies errors as they come out of client-go's real
// REST client (StatusErrors decoded from a Status body or built from a
// bare response, *url.Error from the transport), through the adapter's
// requests — and checks that the server's Retry-After survives into the
// delay the dispatcher's backoff will use.
func TestRESTErrors(t *testing.T) {
	s := newAPIServer(t, newPod("p"))
	pods := podsFor(s.client(t))
	require.IsType(t, restPods{}, pods, "a real clientset is used through its REST client")
	patch := func() error {
		_, err := pods.patchStatus(t.Context(), ns, "p", []byte(`{"status":{"nominatedNodeName":"n1"}}`))
		return err
	}
	bind := func() error {
		return pods.bind(t.Context(), &v1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Target: v1.ObjectReference{Name: "n1"}})
	}
	status := func(err *apierrors.StatusError) func(w http.ResponseWriter, r *http.Request, n int) bool {
		return func(w http.ResponseWriter, r *http.Request, n int) bool { writeStatus(w, err); return true }
	}
	text := func(code, retryAfter int) func(w http.ResponseWriter, r *http.Request, n int) bool {
		return func(w http.ResponseWriter, r *http.Request, n int) bool {
			writeText(w, code, retryAfter, "oops")
			return true
		}
	}
	cases := []struct {
		name    string
		respond func(w http.ResponseWriter, r *http.Request, n int) bool
		call    func() error
		class   dispatch.Class
		delay   time.Duration
		check   func(error) bool
	}{
		{"429 text with Retry-After (max-in-flight)", text(429, 3), patch, dispatch.ClassRetry, 3 * time.Second, apierrors.IsTooManyRequests},
		{"429 Status with retryAfterSeconds (APF)", status(apierrors.NewTooManyRequests("throttled", 2)), patch, dispatch.ClassRetry, 2 * time.Second, apierrors.IsTooManyRequests},
		{"500 Status", status(apierrors.NewInternalError(errors.New("etcd"))), patch, dispatch.ClassRetry, 0, apierrors.IsInternalError},
		{"503 text with Retry-After", text(503, 1), bind, dispatch.ClassRetry, time.Second, apierrors.IsServiceUnavailable},
		{"504 Status ServerTimeout", status(apierrors.NewServerTimeout(podsResource, "patch", 1)), patch, dispatch.ClassRetry, time.Second, apierrors.IsServerTimeout},
		{"502 text", text(502, 0), patch, dispatch.ClassRetry, 0, apierrors.IsInternalError},
		{"409 Status Conflict", status(apierrors.NewConflict(podsResource, "p", errors.New("modified"))), patch, dispatch.ClassRecompute, 0, apierrors.IsConflict},
		{"409 Status already assigned", status(apierrors.NewConflict(podsResource, "p", errors.New("already assigned"))), bind, dispatch.ClassRecompute, 0, apierrors.IsConflict},
		{"409 text to a POST", text(409, 0), bind, dispatch.ClassRecompute, 0, apierrors.IsAlreadyExists},
		{"404 Status", status(apierrors.NewNotFound(podsResource, "p")), patch, dispatch.ClassPermanent, 0, apierrors.IsNotFound},
		{"401 Status", status(apierrors.NewUnauthorized("no")), patch, dispatch.ClassPermanent, 0, apierrors.IsUnauthorized},
		{"403 Status", status(apierrors.NewForbidden(podsResource, "p", errors.New("rbac"))), bind, dispatch.ClassPermanent, 0, apierrors.IsForbidden},
		{"422 text", text(422, 0), patch, dispatch.ClassPermanent, 0, apierrors.IsInvalid},
		{"400 Status", status(apierrors.NewBadRequest("bad")), patch, dispatch.ClassPermanent, 0, apierrors.IsBadRequest},
		{"405 text", text(405, 0), patch, dispatch.ClassPermanent, 0, apierrors.IsMethodNotSupported},
		{"413 Status", status(apierrors.NewRequestEntityTooLargeError("big")), patch, dispatch.ClassPermanent, 0, apierrors.IsRequestEntityTooLargeError},
		//lint:ignore SA1019 a 410 Gone from the server must still be classified
		{"410 Status", status(apierrors.NewGone("gone")), patch, dispatch.ClassPermanent, 0, apierrors.IsGone},
		{"connection dropped mid-request", func(w http.ResponseWriter, r *http.Request, n int) bool {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return true
		}, bind, dispatch.ClassRetry, 0, func(error) bool { return true }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(s.requests())
			s.setRespond(c.respond)
			err := c.call()
			require.Error(t, err)
			assert.True(t, c.check(err), "%T: %v", err, err)
			assert.Equal(t, c.class, Classify(err), "%v", err)
			var hint interface{ RetryAfter() time.Duration }
			if c.delay == 0 {
				assert.False(t, errors.As(retryafter.FromStatus(err), &hint))
			} else if assert.ErrorAs(t, retryafter.FromStatus(err), &hint) {
				assert.Equal(t, c.delay, hint.RetryAfter())
			}
			assert.Len(t, s.requests(), before+1, "one request: client-go did not retry on its own")
		})
	}
	s.setRespond(nil)

	t.Run("connection refused", func(t *testing.T) {
		dead := httptest.NewServer(http.NotFoundHandler())
		dead.Close()
		cs, err := kubernetes.NewForConfig(RESTConfig(&rest.Config{Host: dead.URL}))
		require.NoError(t, err)
		_, err = podsFor(cs).get(t.Context(), ns, "p")
		require.Error(t, err)
		assert.Equal(t, dispatch.ClassRetry, Classify(err), "%v", err)
	})
	t.Run("client timeout", func(t *testing.T) {
		s.setRespond(func(w http.ResponseWriter, r *http.Request, n int) bool {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return true
		})
		defer s.setRespond(nil)
		cfg := RESTConfig(&rest.Config{Host: s.srv.URL, Timeout: 50 * time.Millisecond})
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		_, err = podsFor(cs).get(t.Context(), ns, "p")
		require.Error(t, err)
		assert.Equal(t, dispatch.ClassRetry, Classify(err), "%v", err)
	})
}

// TestRESTCalls: each call, through the real REST client, makes the
// request kube-apiserver expects — the binding with the pod's UID, the
// status patch with its UID and resourceVersion preconditions, the
// deletion with its UID precondition — and the 409 of a binding that had
// landed is resolved by reading the pod back; the 422 of a condition patch
// whose pod was replaced ends the deletion, with nothing written.
func TestRESTCalls(t *testing.T) {
	s := newAPIServer(t, newPod("a"), newPod("b"), newPod("c"))
	d, err := NewDispatcher(s.client(t), Options{})
	require.NoError(t, err)
	defer closeD(t, d)
	get := func(name string) *v1.Pod {
		s.mu.Lock()
		defer s.mu.Unlock()
		p, _ := s.store.get(name)
		return p
	}

	// Status patch with precondition.
	r := outcome(t, submit(t, d, PatchStatus(get("a"), StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/1 nodes")}})))
	require.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
	assert.Equal(t, "0/1 nodes", findCondition(&get("a").Status, v1.PodScheduled).Message)

	// Binding whose first response is lost: the server binds, then drops
	// the connection; the dispatcher reads the pod back and is done.
	s.setRespond(func(w http.ResponseWriter, r *http.Request, n int) bool {
		if r.Method != http.MethodPost {
			return false
		}
		s.mu.Lock()
		s.store.assign("b", "n1")
		s.mu.Unlock()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return true
	})
	r = outcome(t, submit(t, d, Bind(get("b"), "n1")))
	require.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
	assert.Equal(t, 1, r.Attempts)
	assert.Equal(t, uint64(1), d.Stats().AlreadyDone)
	s.setRespond(nil)

	// Binding refused: the pod is on another node.
	r = outcome(t, submit(t, d, Bind(get("b"), "n2")))
	assert.Equal(t, dispatch.StateFailed, r.State)
	assert.ErrorContains(t, r.Err, "bound to node n1")

	// Deletion of a pod that was replaced: the newer pod stays, without
	// the condition.
	victim := get("c")
	s.mu.Lock()
	newer := victim.DeepCopy()
	newer.UID = "uid-newer"
	s.store.add(newer)
	s.mu.Unlock()
	r = outcome(t, submit(t, d, Delete(victim, &v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue})))
	assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
	require.NotNil(t, get("c"))
	assert.Nil(t, findCondition(&get("c").Status, v1.DisruptionTarget))
	r = outcome(t, submit(t, d, Delete(get("c"), nil)))
	assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
	assert.Nil(t, get("c"))

	var methods []string
	for _, q := range s.requests() {
		methods = append(methods, q.Method+" "+q.Path)
		switch q.Method {
		case http.MethodPatch:
			if q.Path == "/api/v1/namespaces/default/pods/a/status" {
				assert.Contains(t, q.Body, `"resourceVersion":"1"`)
			}
			assert.Contains(t, q.Body, `"uid":"uid-`+path.Base(path.Dir(q.Path))+`"`, "fenced by the UID of the call's pod")
		case http.MethodPost:
			assert.Contains(t, q.Body, `"uid":"uid-b"`)
		case http.MethodDelete:
			assert.Contains(t, q.Body, `"preconditions":{"uid":"uid-newer"}`)
		}
	}
	assert.Equal(t, []string{
		"PATCH /api/v1/namespaces/default/pods/a/status",
		"POST /api/v1/namespaces/default/pods/b/binding",
		"GET /api/v1/namespaces/default/pods/b",
		"POST /api/v1/namespaces/default/pods/b/binding",
		"GET /api/v1/namespaces/default/pods/b",
		"PATCH /api/v1/namespaces/default/pods/c/status",
		"DELETE /api/v1/namespaces/default/pods/c",
	}, methods)
}

// TestRESTRetryAfter: end to end through the real REST stack, a 429 with
// Retry-After: 1 reaches the dispatcher at once (client-go's own retry
// loop is off), which waits the server's second in its queue and tries
// again: two requests, a second apart, one retry of exactly 1s.
//
// The typed path shows why: a clientset whose REST client the adapter
// cannot reach is retried by client-go itself, inside the worker — the
// dispatcher sees one attempt and never the server's delay.
func TestRESTRetryAfter(t *testing.T) {
	throttleFirst := func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n == 1 {
			writeText(w, http.StatusTooManyRequests, 1, "Too many requests, please try again later.")
			return true
		}
		return false
	}
	for _, direct := range []bool{true, false} {
		name := map[bool]string{true: "REST client", false: "typed client"}[direct]
		t.Run(name, func(t *testing.T) {
			s := newAPIServer(t, newPod("p"))
			s.setRespond(throttleFirst)
			var client kubernetes.Interface = s.client(t)
			if !direct {
				client = hideREST{client.(*kubernetes.Clientset)}
			}
			obs := &retryLog{}
			d, err := NewDispatcher(client, Options{Observer: obs})
			require.NoError(t, err)
			defer closeD(t, d)
			r := outcome(t, submit(t, d, PatchStatus(newPod("p"), StatusPatch{NominatedNodeName: ptr("n1")})))
			require.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
			reqs := s.requests()
			require.Len(t, reqs, 2)
			assert.GreaterOrEqual(t, reqs[1].At.Sub(reqs[0].At), time.Second, "not before the server's Retry-After")
			if direct {
				assert.Equal(t, 2, r.Attempts)
				ev := obs.get()
				require.Len(t, ev, 1)
				assert.Equal(t, time.Second, ev[0].Delay)
				assert.True(t, apierrors.IsTooManyRequests(ev[0].Err))
			} else {
				assert.Equal(t, 1, r.Attempts, "client-go slept it out in the worker")
				assert.Empty(t, obs.get())
			}
		})
	}
}

// hideREST is a clientset whose REST client the adapter cannot see, as a
// wrapper around a real clientset would be.
type hideREST struct{ *kubernetes.Clientset }

func (c hideREST) CoreV1() corev1.CoreV1Interface { return hiddenCore{c.Clientset.CoreV1()} }

type hiddenCore struct{ corev1.CoreV1Interface }

func (hiddenCore) RESTClient() rest.Interface { return nil }

// TestRESTThrottling: with the clientset set up by RESTConfig there is no
// client-side limiter, and the dispatcher's own limit (20 qps, burst 1)
// spaces the requests at the server by 50ms.
func TestRESTThrottling(t *testing.T) {
	const n = 11
	var pods []*v1.Pod
	for i := range n {
		pods = append(pods, newPod(fmt.Sprintf("p%d", i)))
	}
	s := newAPIServer(t, pods...)
	client := s.client(t)
	assert.Nil(t, client.CoreV1().RESTClient().GetRateLimiter(), "RESTConfig: no client-side bucket")
	d, err := NewDispatcher(client, Options{QPS: 20, Burst: 1})
	require.NoError(t, err)
	defer closeD(t, d)
	var tks []*Ticket
	for _, p := range pods {
		tks = append(tks, submit(t, d, Bind(p, "n1")))
	}
	for _, tk := range tks {
		require.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
	}
	reqs := s.requests()
	require.Len(t, reqs, n)
	assert.GreaterOrEqual(t, reqs[n-1].At.Sub(reqs[0].At), (n-1)*50*time.Millisecond-20*time.Millisecond,
		"%d requests at 20 qps, burst 1", n)
}
