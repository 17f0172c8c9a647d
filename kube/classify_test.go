package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/internal/retryafter"
	"github.com/stretchr/testify/assert"
	"golang.org/x/net/http2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// TestClassify covers every row of Classify's table with the errors
// apimachinery makes, bare and wrapped as callers wrap them, and the
// transport errors that come out of net/http; each with a server's delay
// attached too, which does not change its class.
func TestClassify(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	cause := errors.New("cause")
	urlErr := func(err error) error {
		return &url.Error{Op: "Patch", URL: "https://10.0.0.1/api/v1/namespaces/default/pods/p/status", Err: err}
	}
	opErr := func(errno syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: errno}}
	}
	cases := []struct {
		name string
		err  error
		want dispatch.Class
	}{
		// Retry: the server is busy or failing, or the connection broke.
		{"TooManyRequests", apierrors.NewTooManyRequests("slow down", 2), dispatch.ClassRetry},
		{"TooManyRequestsError", apierrors.NewTooManyRequestsError("slow down"), dispatch.ClassRetry},
		{"ServerTimeout", apierrors.NewServerTimeout(gr, "patch", 1), dispatch.ClassRetry},
		{"Timeout", apierrors.NewTimeoutError("took too long", 0), dispatch.ClassRetry},
		{"ServiceUnavailable", apierrors.NewServiceUnavailable("down"), dispatch.ClassRetry},
		{"InternalError", apierrors.NewInternalError(cause), dispatch.ClassRetry},
		{"502 generic", apierrors.NewGenericServerResponse(502, "PATCH", gr, "p", "bad gateway", 0, true), dispatch.ClassRetry},
		{"503 generic", apierrors.NewGenericServerResponse(503, "POST", gr, "p", "", 0, true), dispatch.ClassRetry},
		{"504 generic", apierrors.NewGenericServerResponse(504, "DELETE", gr, "p", "", 0, true), dispatch.ClassRetry},
		{"connection refused", urlErr(opErr(syscall.ECONNREFUSED)), dispatch.ClassRetry},
		{"connection reset", urlErr(&net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}), dispatch.ClassRetry},
		{"EOF", urlErr(io.EOF), dispatch.ClassRetry},
		{"unexpected EOF", urlErr(io.ErrUnexpectedEOF), dispatch.ClassRetry},
		{"broken connection", urlErr(errors.New("http: can't write HTTP request on broken connection")), dispatch.ClassRetry},
		{"closed connection", urlErr(errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection")), dispatch.ClassRetry},
		// A reused HTTP/1 connection the server closed as the request was
		// sent: net/http returns these to a PATCH or POST, which it does
		// not resend itself (golang/go#19943).
		{"server closed idle connection", urlErr(errors.New("http: server closed idle connection")), dispatch.ClassRetry},
		{"broken pipe", urlErr(&net.OpError{Op: "write", Net: "tcp", Err: &os.SyscallError{Syscall: "write", Err: syscall.EPIPE}}), dispatch.ClassRetry},
		{"broken pipe, part written", urlErr(fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w",
			&net.OpError{Op: "write", Net: "tcp", Err: &os.SyscallError{Syscall: "write", Err: syscall.EPIPE}})), dispatch.ClassRetry},
		{"http2 GOAWAY", urlErr(errors.New("http2: server sent GOAWAY and closed the connection; LastStreamID=1")), dispatch.ClassRetry},
		{"http2 connection lost", urlErr(errors.New("http2: client connection lost")), dispatch.ClassRetry},
		// What a proxy's RST_STREAM gives client-go (x/net/http2), seen
		// against kube-apiserver in test/integration's lost-response
		// scenario, and what net/http's own HTTP/2 gives.
		{"http2 stream reset", urlErr(http2.StreamError{StreamID: 5, Code: http2.ErrCodeInternal, Cause: errors.New("received from peer")}), dispatch.ClassRetry},
		{"http2 stream refused", urlErr(http2.StreamError{StreamID: 7, Code: http2.ErrCodeRefusedStream}), dispatch.ClassRetry},
		{"http2 stream reset, net/http's HTTP/2", urlErr(errors.New("stream error: stream ID 5; INTERNAL_ERROR; received from peer")), dispatch.ClassRetry},
		{"net timeout", urlErr(timeoutErr{}), dispatch.ClassRetry},
		{"attempt deadline", fmt.Errorf("patch: %w", context.DeadlineExceeded), dispatch.ClassRetry},

		// Recompute: the call was built from a view the server refused.
		{"Conflict", apierrors.NewConflict(gr, "p", cause), dispatch.ClassRecompute},
		{"already assigned", apierrors.NewConflict(gr, "p", errors.New(`pod p is already assigned to node "n1"`)), dispatch.ClassRecompute},
		{"409 generic PATCH", apierrors.NewGenericServerResponse(409, "PATCH", gr, "p", "", 0, true), dispatch.ClassRecompute},
		{"409 generic POST (AlreadyExists)", apierrors.NewGenericServerResponse(409, "POST", gr, "p", "", 0, true), dispatch.ClassRecompute},
		{"AlreadyExists", apierrors.NewAlreadyExists(gr, "p"), dispatch.ClassRecompute},

		// Permanent: retrying cannot help.
		{"Unauthorized", apierrors.NewUnauthorized("who are you"), dispatch.ClassPermanent},
		{"Forbidden", apierrors.NewForbidden(gr, "p", cause), dispatch.ClassPermanent},
		{"Invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", field.ErrorList{field.Required(field.NewPath("spec"), "")}), dispatch.ClassPermanent},
		{"BadRequest", apierrors.NewBadRequest("bad"), dispatch.ClassPermanent},
		{"MethodNotSupported", apierrors.NewMethodNotSupported(gr, "patch"), dispatch.ClassPermanent},
		{"RequestEntityTooLarge", apierrors.NewRequestEntityTooLargeError("big"), dispatch.ClassPermanent},
		{"NotFound", apierrors.NewNotFound(gr, "p"), dispatch.ClassPermanent},
		//lint:ignore SA1019 the server still answers 410 Gone; its classification is what is tested
		{"Gone", apierrors.NewGone("gone"), dispatch.ClassPermanent},
		{"ResourceExpired", apierrors.NewResourceExpired("expired"), dispatch.ClassPermanent},
		{"404 generic", apierrors.NewGenericServerResponse(404, "PATCH", gr, "p", "", 0, true), dispatch.ClassPermanent},
		{"unknown error", errors.New("something else"), dispatch.ClassPermanent},
		{"canceled", context.Canceled, dispatch.ClassPermanent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, Classify(c.err), "bare")
			assert.Equal(t, c.want, Classify(fmt.Errorf("kube: bind: %w", c.err)), "wrapped with %%w")
			assert.Equal(t, c.want, Classify(retryafter.FromStatus(c.err)), "as exec returns it")
			// The server's delay does not change the class, whatever error
			// it ends up attached to.
			assert.Equal(t, c.want, Classify(retryafter.Wrap(c.err, time.Second)), "with a delay")
		})
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestWithDelay: an API error that asks for a delay comes out of exec in a
// form the dispatcher's backoff honours (RetryAfter) and that every
// apierrors test and errors.Is still sees through.
func TestWithDelay(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	cases := []struct {
		name string
		err  error
		want time.Duration
	}{
		{"429 with Retry-After", apierrors.NewTooManyRequests("slow down", 3), 3 * time.Second},
		{"ServerTimeout", apierrors.NewServerTimeout(gr, "patch", 2), 2 * time.Second},
		{"503 with Retry-After from a header", apierrors.NewGenericServerResponse(503, "PATCH", gr, "p", "", 5, true), 5 * time.Second},
		{"wrapped", fmt.Errorf("x: %w", apierrors.NewTooManyRequests("slow down", 1)), time.Second},
		{"429 without a delay", apierrors.NewTooManyRequestsError("slow down"), 0},
		{"ServerTimeout without a delay", apierrors.NewServerTimeout(gr, "patch", 0), 0},
		{"not an API error", io.EOF, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := retryafter.FromStatus(c.err)
			assert.ErrorIs(t, got, c.err)
			assert.Equal(t, c.err.Error(), got.Error())
			var hint interface{ RetryAfter() time.Duration }
			if c.want == 0 {
				assert.Same(t, c.err, got, "no delay: the error is returned as it is")
				return
			}
			if assert.ErrorAs(t, got, &hint) {
				assert.Equal(t, c.want, hint.RetryAfter())
			}
			assert.Equal(t, apierrors.IsTooManyRequests(c.err), apierrors.IsTooManyRequests(got))
			s, ok := apierrors.SuggestsClientDelay(got)
			assert.True(t, ok)
			assert.Equal(t, c.want, time.Duration(s)*time.Second)
		})
	}
	assert.NoError(t, retryafter.FromStatus(nil))
}

// TestClassifyDialFailures: a request whose connection could not be made
// sent nothing, so it is retried, as a refused connection is: the API
// server's address unreachable for a moment (no route to host, network
// unreachable, as while a control plane's virtual IP moves) and a DNS
// lookup that failed for the moment. A name that does not exist is a
// misconfiguration, and stays permanent.
func TestClassifyDialFailures(t *testing.T) {
	dial := func(err error) error {
		return &url.Error{Op: "Post", URL: "https://apiserver:6443/api/v1/namespaces/default/pods/p/binding",
			Err: &net.OpError{Op: "dial", Net: "tcp", Err: err}}
	}
	cases := []struct {
		name string
		err  error
		want dispatch.Class
	}{
		{"no route to host", dial(&os.SyscallError{Syscall: "connect", Err: syscall.EHOSTUNREACH}), dispatch.ClassRetry},
		{"network unreachable", dial(&os.SyscallError{Syscall: "connect", Err: syscall.ENETUNREACH}), dispatch.ClassRetry},
		{"DNS server failure", dial(&net.DNSError{Err: "server misbehaving", Name: "apiserver", IsTemporary: true}), dispatch.ClassRetry},
		{"DNS timeout", dial(&net.DNSError{Err: "i/o timeout", Name: "apiserver", IsTimeout: true}), dispatch.ClassRetry},
		{"no such host", dial(&net.DNSError{Err: "no such host", Name: "apiserver", IsNotFound: true}), dispatch.ClassPermanent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, Classify(c.err))
			assert.Equal(t, c.want, Classify(fmt.Errorf("kube: bind: %w", c.err)), "wrapped with %%w")
		})
	}
}
