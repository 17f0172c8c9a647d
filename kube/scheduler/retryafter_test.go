package scheduler

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestRetryAfterGoesWithItsResponse pins that a server's Retry-After is the
// backoff of the error it came with, and of no other: an execution that
// handled a 429 or 503 itself and then failed otherwise is judged, and
// waits, as its own error says — a permanent error is not retried (a
// server's delay does not change the class), and a later response's
// error, or the call's own, waits the retry policy's backoff.
func TestRetryAfterGoesWithItsResponse(t *testing.T) {
	errPlugin := errors.New("plugin: the object cannot be handled")
	cases := []struct {
		name      string
		responses []scriptedResponse // the execution's requests, in order; later ones are 200
		returns   error              // what Execute returns; nil: the last request's error
		classify  func(error) dispatch.Class
		wantExecs int
		wantGap   time.Duration // between the two executions
	}{
		{
			name:      "a permanent error after a Retry-After handled inside Execute is not retried",
			responses: []scriptedResponse{{code: http.StatusServiceUnavailable, retryAfter: "1"}, {code: http.StatusOK}},
			returns:   errPlugin, wantExecs: 1,
		},
		{
			name:      "a later response without Retry-After clears the earlier one's",
			responses: []scriptedResponse{{code: http.StatusServiceUnavailable, retryAfter: "30"}, {code: http.StatusInternalServerError}},
			wantExecs: 2, wantGap: time.Second,
		},
		{
			name:      "the call's own error does not carry the last response's delay",
			responses: []scriptedResponse{{code: http.StatusTooManyRequests, retryAfter: "30"}},
			returns:   errPlugin, classify: func(error) dispatch.Class { return dispatch.ClassRetry },
			wantExecs: 2, wantGap: time.Second,
		},
		{
			name:      "the error a Retry-After came with waits it out",
			responses: []scriptedResponse{{code: http.StatusTooManyRequests, retryAfter: "30"}},
			wantExecs: 2, wantGap: 30 * time.Second,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &scriptedServer{script: c.responses}
				cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://apiserver.invalid", Transport: srv, QPS: 1000, Burst: 1000})
				require.NoError(t, err)
				d, err := New(cs, fwk.APICallRelevances{}, Options{Classify: c.classify,
					Retry: dispatch.RetryPolicy{InitialBackoff: time.Second, Jitter: dispatch.JitterNone, BudgetRatio: 1}})
				require.NoError(t, err)
				require.True(t, d.wire.metered, d.wire.why)
				d.Start(testLogger(t))
				t.Cleanup(func() { require.NoError(t, d.Close(canceled())) })

				call := &readingCall{requests: len(c.responses), returns: c.returns}
				tk, err := d.Submit(call, fwk.APICallOptions{})
				require.NoError(t, err)
				time.Sleep(time.Minute)
				synctest.Wait()
				res, ok := tk.Result()
				require.True(t, ok)
				starts := call.executions()
				require.Len(t, starts, c.wantExecs)
				assert.Equal(t, c.wantExecs, res.Outcome.Attempts)
				if c.returns != nil && c.classify == nil {
					assert.ErrorIs(t, res.Err, c.returns)
				}
				if c.wantExecs > 1 {
					assert.Equal(t, c.wantGap, starts[1].Sub(starts[0]))
				}
			})
		})
	}
}

// scriptedResponse is one answer of a scriptedServer: a status code and,
// if not empty, a Retry-After header.
type scriptedResponse struct {
	code       int
	retryAfter string
}

// scriptedServer is a transport that answers its requests from a script,
// in order, and every request after the script with a pod.
type scriptedServer struct {
	mu     sync.Mutex
	n      int
	script []scriptedResponse
}

func (s *scriptedServer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	s.mu.Lock()
	resp := scriptedResponse{code: http.StatusOK}
	if s.n < len(s.script) {
		resp = s.script[s.n]
	}
	s.n++
	s.mu.Unlock()
	h := http.Header{"Content-Type": {"application/json"}}
	body := `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"default"}}`
	if resp.code != http.StatusOK {
		h.Set("Content-Type", "text/plain")
		body = "busy"
	}
	if resp.retryAfter != "" {
		h.Set("Retry-After", resp.retryAfter)
	}
	return &http.Response{StatusCode: resp.code, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
}

// readingCall reads its pod up to requests times in each execution,
// stopping at the first success, as upstream's calls retry inside
// Execute; then it returns returns, or the last read's error.
type readingCall struct {
	requests int
	returns  error

	mu     sync.Mutex
	starts []time.Time
}

func (c *readingCall) CallType() fwk.APICallType                   { return "plugin_call" }
func (c *readingCall) UID() types.UID                              { return "p" }
func (c *readingCall) Merge(fwk.APICall) error                     { return nil }
func (c *readingCall) IsNoOp() bool                                { return false }
func (c *readingCall) Sync(o metav1.Object) (metav1.Object, error) { return o, nil }

func (c *readingCall) Execute(ctx context.Context, client kubernetes.Interface) error {
	c.mu.Lock()
	c.starts = append(c.starts, time.Now())
	first := len(c.starts) == 1
	c.mu.Unlock()
	var err error
	for range c.requests {
		if _, err = client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{}); err == nil {
			break
		}
	}
	if c.returns != nil && first {
		return c.returns
	}
	if first {
		return err
	}
	return nil // a retry succeeds
}

func (c *readingCall) executions() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.starts...)
}
