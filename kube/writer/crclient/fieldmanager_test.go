package crclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/crclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Options.FieldManager names the writer in every request: through
// controller-runtime's own client over HTTP, the updates (object and
// status) carry it as the patches do.
func TestUpdateCarriesFieldManager(t *testing.T) {
	var mu sync.Mutex
	managers := map[string]string{} // method+path -> fieldManager query
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		managers[r.Method+" "+r.URL.Path] = r.URL.Query().Get("fieldManager")
		mu.Unlock()
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		_, _ = w.Write(body) // the object as sent: enough for the client
	}))
	defer srv.Close()

	opts := deployOptions(t)
	c, err := client.New(writer.RESTConfig(&rest.Config{Host: srv.URL}), opts)
	require.NoError(t, err)

	w, err := writer.New(crclient.New[deploy](c, nil), writer.Options[deploy]{FieldManager: "ctl"})
	require.NoError(t, err)
	defer w.Close(t.Context())
	d := web()
	d.ResourceVersion = "1"
	tk, err := w.Submit(t.Context(), d, writer.Desire[deploy]{
		Status: ready,
		Object: func(d deploy) error { d.Labels = map[string]string{"ready": "yes"}; return nil },
	}, writer.SetOptions{})
	require.NoError(t, err)
	_, err = tk.Wait(t.Context())
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("fieldManager by request: %q", managers)
	assert.Equal(t, "ctl", managers["PUT /apis/apps/v1/namespaces/default/deployments/web/status"])
	assert.Equal(t, "ctl", managers["PUT /apis/apps/v1/namespaces/default/deployments/web"])
}
