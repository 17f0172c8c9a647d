package apidispatcher

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	upstream "k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher"
	apicalls "k8s.io/kubernetes/pkg/scheduler/framework/api_calls"
)

// TestHeadersAsUpstream: through a clientset built as kube-scheduler
// builds its own — protobuf, its user agent, compression off, a token
// bucket of 50 qps and burst 100 — the drop-in sends upstream's binding
// and status patch exactly as upstream's dispatcher sends them: the same
// method, path and query, and every header the same (Content-Type, Accept,
// User-Agent, credentials...). The drop-in runs them on a clientset it
// derives from the given one, without the bucket; nothing else may
// differ.
func TestHeadersAsUpstream(t *testing.T) {
	enableAsyncAPICalls(t)
	run := func(t *testing.T, newDispatcher func(clientset.Interface) (dispatcher, func(klog.Logger))) []sentRequest {
		s := newHeaderServer(t)
		cfg := &rest.Config{
			Host:               s.srv.URL,
			BearerToken:        "secret",
			ContentConfig:      rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"},
			DisableCompression: true,
			QPS:                50,
			Burst:              100,
		}
		cs, err := clientset.NewForConfig(rest.AddUserAgent(cfg, "scheduler"))
		require.NoError(t, err)
		d, run := newDispatcher(cs)
		defer d.Close()
		logger, _ := ktesting.NewTestContext(t)
		run(logger)
		// One call at a time, so that the requests arrive in one order.
		bound := make(chan error, 1)
		require.NoError(t, d.Add(apicalls.Implementations.PodBinding(&v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "default", UID: "uid-a"},
			Target:     v1.ObjectReference{Kind: "Node", Name: "node-1"},
		}), fwk.APICallOptions{OnFinish: bound}))
		require.NoError(t, receive(t, bound, "the binding's outcome"))
		patched := make(chan error, 1)
		require.NoError(t, d.Add(unschedulable(testPod("b")), fwk.APICallOptions{OnFinish: patched}))
		require.NoError(t, receive(t, patched, "the status patch's outcome"))
		return s.requests()
	}
	var ours, theirs []sentRequest
	t.Run("drop-in", func(t *testing.T) {
		ours = run(t, func(cs clientset.Interface) (dispatcher, func(klog.Logger)) {
			d := New(cs, 16, apicalls.Relevances)
			return d, d.Run
		})
	})
	t.Run("upstream", func(t *testing.T) {
		theirs = run(t, func(cs clientset.Interface) (dispatcher, func(klog.Logger)) {
			d := upstream.New(cs, 16, apicalls.Relevances)
			return d, d.Run
		})
	})
	require.Len(t, theirs, 2, "upstream's binding and status patch")
	assert.Equal(t, "application/vnd.kubernetes.protobuf", theirs[0].Header.Get("Content-Type"), "the binding, in the client's content type")
	assert.Equal(t, theirs, ours)
}

// sentRequest is a request as the server received it, but for the host
// and the body (whose encoding Content-Type names).
type sentRequest struct {
	Method string
	URI    string // path and query
	Header http.Header
}

// headerServer records every request and answers as the API server does a
// binding (201) and a status patch (the pod).
type headerServer struct {
	srv *httptest.Server

	mu   sync.Mutex
	sent []sentRequest
}

func newHeaderServer(t *testing.T) *headerServer {
	s := &headerServer{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.sent = append(s.sent, sentRequest{Method: r.Method, URI: r.URL.RequestURI(), Header: r.Header.Clone()})
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Success","code":201}`)
			return
		}
		fmt.Fprint(w, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b","namespace":"default"}}`)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *headerServer) requests() []sentRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent)
}
