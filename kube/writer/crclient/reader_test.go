package crclient_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/crclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// throttledReads is an API server, in memory, for default/web: its first
// read is answered 429 with a Retry-After of 3 seconds.
type throttledReads struct {
	mu   sync.Mutex
	gets int
}

func (s *throttledReads) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
	}
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "application/json")
	s.mu.Lock()
	if r.Method == http.MethodGet {
		s.gets++
	}
	first := r.Method == http.MethodGet && s.gets == 1
	s.mu.Unlock()
	if first {
		rec.Header().Set("Retry-After", "3")
		rec.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(rec).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests})
	} else {
		_ = json.NewEncoder(rec).Encode(&appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1", ResourceVersion: "2"}})
	}
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// The setup the package documentation shows reads through the client
// made from writer.RESTConfig: a read the server throttles is waited out
// in the writer's queue (two attempts), not slept out and resent by
// client-go inside the worker.
func TestDocumentedSetupReadsThroughTheWritersConfig(t *testing.T) {
	for _, f := range []string{"doc.go", "README.md"} {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.Contains(t, string(src), "crclient.New[*v1.Widget](c, nil)", f)
		assert.NotContains(t, string(src), "GetAPIReader", f)
	}
	synctest.Test(t, func(t *testing.T) {
		s := &throttledReads{}
		opts := deployOptions(t)
		c, err := client.New(writer.RESTConfig(&rest.Config{Host: "http://apiserver.invalid", Transport: s}), opts)
		require.NoError(t, err)
		w, err := writer.New(crclient.New[deploy](c, nil), writer.Options[deploy]{})
		require.NoError(t, err)
		defer w.Close(t.Context())
		start := time.Now()
		tk, err := w.Submit(t.Context(), web(), writer.Desire[deploy]{Status: ready}, writer.SetOptions{}) // no resourceVersion: read first
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 2, res.Attempts, "the writer retried the read")
		assert.Equal(t, uint64(2), w.Stats().Reads)
		assert.GreaterOrEqual(t, time.Since(start), 3*time.Second)
	})

	// A reader whose config is not writer.RESTConfig's — as
	// mgr.GetAPIReader()'s is not — leaves the 429 to client-go, which
	// sleeps it out and resends the read inside the worker: one attempt.
	synctest.Test(t, func(t *testing.T) {
		s := &throttledReads{}
		opts := deployOptions(t)
		c, err := client.New(writer.RESTConfig(&rest.Config{Host: "http://apiserver.invalid", Transport: s}), opts)
		require.NoError(t, err)
		plain, err := client.New(&rest.Config{Host: "http://apiserver.invalid", Transport: s}, opts)
		require.NoError(t, err)
		w, err := writer.New(crclient.New[deploy](c, plain), writer.Options[deploy]{})
		require.NoError(t, err)
		defer w.Close(t.Context())
		tk, err := w.Submit(t.Context(), web(), writer.Desire[deploy]{Status: ready}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, res.Attempts, "client-go resent the read in the worker")
		assert.Equal(t, 2, s.gets)
	})
}
