package writer

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/kube/internal/retryafter"
	"k8s.io/client-go/rest"
)

// RESTConfig returns a copy of cfg for the writer's own client (a
// clientset, a dynamic client, a controller-runtime client), with two
// changes, both for the writer's priority order:
//
//   - No client-side rate limit (kube.RESTConfig: QPS -1, no
//     RateLimiter): the writer takes a token of its own limiter
//     (Options.QPS) before it chooses which write runs, so the most urgent
//     write gets the next token. A bucket in the client would sit behind
//     that choice and hand its tokens out in whatever order workers reach
//     it: a Ready condition would wait behind every routine write that
//     already holds a worker.
//   - For the writer's requests only, a 429 or 5xx answer's Retry-After
//     header, and a read's broken connection, are handed to the writer
//     instead of to client-go, which would otherwise sleep them out and
//     resend inside the worker, up to ten times; the writer waits them out
//     in its queue, holding no worker. Other requests made with the config
//     are left as client-go makes them.
//
// Build the writer's client from it, and let the rest of the program keep
// its own config and limits:
//
//	cs, err := kubernetes.NewForConfig(writer.RESTConfig(cfg))
func RESTConfig(cfg *rest.Config) *rest.Config {
	out := kube.RESTConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &tap{next: rt} })
	return out
}

// note is one writer request's account with the tap, carried in its
// context: the delay the server asked for, which the tap took off the
// answer.
type note struct{ retryAfter atomic.Int64 }

type noteKey struct{}

func withNote(ctx context.Context) (context.Context, *note) {
	n := &note{}
	return context.WithValue(ctx, noteKey{}, n), n
}

// tap is the transport RESTConfig adds.
type tap struct{ next http.RoundTripper }

func (t *tap) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	n, _ := req.Context().Value(noteKey{}).(*note)
	if n != nil && err != nil && req.Method == http.MethodGet {
		if _, ok := err.(*hidden); !ok { // hidden already by a tap below (RESTConfig twice)
			err = &hidden{err} // client-go resends a read whose connection broke, after a sleep
		}
		return resp, err
	}
	if n == nil || resp == nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500) {
		return resp, err
	}
	if d, ok := retryafter.Header(resp.Header); ok {
		resp.Header.Del("Retry-After") // client-go resends only when the header is there
		n.retryAfter.Store(int64(d))
	}
	return resp, err
}

// WrappedRoundTripper lets client-go's transport utilities see through the
// tap.
func (t *tap) WrappedRoundTripper() http.RoundTripper { return t.next }

// hidden is the transport error of a writer's read, as the tap hands it to
// client-go: of no type and no text client-go resends a read for (a reset
// or closed connection, an EOF), so that the read fails at once and the
// writer retries it in its queue. reveal takes the error back.
type hidden struct{ err error }

func (*hidden) Error() string { return "writer: the read failed in transport" }

// reveal returns err with the transport error the tap hid put back.
func reveal(err error) error {
	var h *hidden
	if !errors.As(err, &h) {
		return err
	}
	if ue, ok := errors.AsType[*url.Error](err); ok && ue.Err == h {
		return &url.Error{Op: ue.Op, URL: ue.URL, Err: h.err}
	}
	return h.err
}

// withDelay wraps err with the delay the server asked for: the header the
// tap took, or a Status's details.retryAfterSeconds. A transport error the
// tap hid is put back first.
func withDelay(err error, n *note) error {
	err = reveal(err)
	if d := time.Duration(n.retryAfter.Load()); d > 0 {
		return retryafter.Wrap(err, d)
	}
	return retryafter.FromStatus(err)
}
