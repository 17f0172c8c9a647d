package kube

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/coalescer/dispatch"
	"golang.org/x/net/http2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Classify judges an error from the Kubernetes API for the dispatcher
// (Options.Classify, by default):
//
//   - Retry: 429 TooManyRequests, ServerTimeout, Timeout (504),
//     ServiceUnavailable (503), InternalError and any other 5xx; connection
//     refused or reset, a connection closed mid-request (EOF, unexpected
//     EOF, a broken pipe, a broken or closed connection, an idle
//     connection the server closed as the request went out, an HTTP/2
//     GOAWAY), an HTTP/2 stream reset before the answer came (RST_STREAM:
//     a proxy or load balancer dropping one request), a connection that
//     could not be made for the moment (no route to the host, the network
//     unreachable, a DNS lookup that failed for now but not a name that
//     does not exist), net.Error timeouts, and the attempt's own deadline.
//   - Recompute: 409 — Conflict, and AlreadyExists, which is how client-go
//     reads a bare 409 to a POST. The call is rebuilt from a fresh read
//     before it runs again (see the calls' documentation).
//   - Permanent: Unauthorized, Forbidden, Invalid, BadRequest,
//     MethodNotSupported, RequestEntityTooLarge, NotFound, Gone and every
//     other status, and any error it does not know.
//
// NotFound is decided per call type before the error gets here: a
// deletion whose pod is gone has succeeded, so only patches and bindings
// report NotFound, and for them the pod is gone for good.
//
// The server's requested delay (Retry-After, a Status's
// details.retryAfterSeconds: apierrors.SuggestsClientDelay) does not
// change the class; the dispatcher's exec carries it to the backoff.
func Classify(err error) dispatch.Class {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		switch {
		case code == http.StatusConflict || apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			return dispatch.ClassRecompute
		case code >= 500,
			apierrors.IsTooManyRequests(err),
			apierrors.IsServerTimeout(err),
			apierrors.IsTimeout(err),
			apierrors.IsServiceUnavailable(err),
			apierrors.IsInternalError(err):
			return dispatch.ClassRetry
		}
		return dispatch.ClassPermanent
	}
	switch {
	case utilnet.IsConnectionRefused(err),
		utilnet.IsConnectionReset(err),
		utilnet.IsProbableEOF(err),
		utilnet.IsHTTP2ConnectionLost(err),
		isStreamReset(err),
		transient(err):
		return dispatch.ClassRetry
	}
	return dispatch.ClassPermanent
}

// transient reports the errors dispatch.DefaultClassifier retries for what
// they are — a deadline, a refused or reset connection, a cut-off answer, a
// network timeout — without its rule that any error carrying a delay is
// retried: the delay does not change the class; and the two ways net/http
// reports an HTTP/1 connection the server closed under a request it does
// not resend itself (a PATCH, a POST): a write to it (EPIPE), or the
// server's close of the idle connection the request was sent on; and a
// connection that could not be made for the moment — the server's host or
// network unreachable, a DNS lookup that failed for now — which sent
// nothing.
func transient(err error) bool {
	var ne net.Error
	var dns *net.DNSError
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) ||
		errors.As(err, &dns) && dns.IsTemporary ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.As(err, &ne) && ne.Timeout() ||
		strings.Contains(err.Error(), "http: server closed idle connection")
}

// isStreamReset reports whether err is an HTTP/2 stream reset: the one
// request failed and its connection lives on, so none of utilnet's
// connection tests see it. Like a connection lost mid-request it leaves
// the write's effect unknown, which every call resolves before it writes
// again: a binding reads the pod back, a status patch carries its
// resourceVersion, a deletion its UID. client-go's transports use
// golang.org/x/net/http2, whose error is typed; net/http's own HTTP/2
// (a rest.Config.Transport of the caller's) has an unexported copy of the
// type, known by its message.
func isStreamReset(err error) bool {
	var se http2.StreamError
	return errors.As(err, &se) || strings.Contains(err.Error(), "stream error: stream ID ")
}
