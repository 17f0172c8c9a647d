package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// testLostBinding is scenario 2: the apiserver binds the pod, and the
// answer never reaches the dispatcher — the proxy withholds it, resetting
// the HTTP/2 stream or the connection, or closing an HTTP/1.1 connection.
// The error is judged worth retrying, and before the retry the adapter reads
// the pod back, finds it bound to its node, and ends the call Succeeded
// without binding again. In the last case the read-back's answer is lost as
// well, so the retry does go out, meets the server's 409 "already assigned",
// and that is resolved the same way.
//
// It proves, for each: the call ends Succeeded; exactly one binding
// succeeded at the server (one 201 at the proxy, the one whose answer was
// lost); the pod is bound to our node; the before-retry check is what
// settled it (Stats.AlreadyDone).
func testLostBinding(t *testing.T, s *apiserver.Server) {
	const node = "node-lost"
	ns := createNamespace(t, s.AdminClient, "lost")
	for _, tc := range []struct {
		name     string
		http11   bool
		mode     apiserver.DropMode
		loseRead bool // lose the answer to the before-retry read too
		want     []string
	}{
		{name: "h2 stream reset", mode: apiserver.AbortRequest, want: []string{"201*"}},
		{name: "h2 connection reset", mode: apiserver.ResetConnection, want: []string{"201*"}},
		{name: "http1.1 connection closed", http11: true, mode: apiserver.AbortRequest, want: []string{"201*"}},
		{name: "http1.1 connection reset", http11: true, mode: apiserver.ResetConnection, want: []string{"201*"}},
		{name: "h2 stream reset, read-back lost: the retry meets 409", mode: apiserver.AbortRequest, loseRead: true, want: []string{"201*", "409"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := s.Config
			if tc.http11 {
				cfg = rest.CopyConfig(s.Config)
				cfg.TLSClientConfig.NextProtos = []string{"http/1.1"}
			}
			d := newDispatcher(t, cfg, kube.Options{})
			name := strings.NewReplacer(" ", "-", ",", "", ":", "", ".", "").Replace(tc.name)
			pod := createPods(t, s.AdminClient, ns, name, 1)[0]

			s.Proxy.DropResponses(apiserver.MatchBinding(ns, pod.Name), 1, tc.mode)
			if tc.loseRead {
				s.Proxy.DropResponses(isPodGet(ns, pod.Name), 1, tc.mode)
			}
			tk, err := d.Submit(t.Context(), kube.Bind(pod, node), kube.SubmitOptions{})
			require.NoError(t, err)
			res := wait(t, tk)

			binds := s.Proxy.Filter(func(r apiserver.Request) bool { return isBinding(r) && r.Namespace == ns && r.Name == pod.Name })
			require.Equal(t, dispatch.StateSucceeded, res.State, "outcome: %v; binding requests %v", res.Err, statuses(binds))
			assert.Equal(t, tc.want, statuses(binds), "binding requests at the server (* = answer lost)")
			created := 0
			for _, r := range binds {
				if r.Status == http.StatusCreated {
					created++
				}
			}
			assert.Equal(t, 1, created, "successful bindings at the server")
			assert.Equal(t, len(tc.want), res.Attempts, "binding attempts")
			assert.Equal(t, node, getPod(t, s, ns, pod.Name).Spec.NodeName)
			assert.Equal(t, uint64(1), d.Stats().AlreadyDone, "settled by the before-retry check")
		})
	}
}
