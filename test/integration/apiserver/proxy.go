package apiserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"
)

// Proxy is a TLS-terminating HTTP reverse proxy on loopback, between clients
// and the apiserver. It serves HTTP/2 and HTTP/1.1 with its own certificate,
// forwards every request (credentials included, its body read in full
// first) to the apiserver, records each one with the status the apiserver
// answered, and, when armed with [Proxy.DropResponses], lets the apiserver
// process a matching request and then withholds the response from the
// client, which sees a transport error while the write did happen.
//
// It terminates TLS, rather than relaying TCP, so that it can see methods
// and paths: the apiserver's certificate stays between the proxy and the
// apiserver, and clients trust the proxy's (see [Proxy.ClientConfig]).
type Proxy struct {
	srv       *httptest.Server
	upstream  *url.URL
	transport *http.Transport
	rp        *httputil.ReverseProxy
	infos     *request.RequestInfoFactory

	mu    sync.Mutex
	log   []Request
	drops []*dropRule
}

// Request is one request the proxy forwarded to the apiserver, as recorded
// when the apiserver's answer arrived (or the forwarding failed).
type Request struct {
	// Method is the HTTP method: GET, POST, PUT, PATCH, DELETE.
	Method string
	// Path is the URL path, such as /api/v1/namespaces/ns/pods/p/binding.
	Path string
	// Verb is the Kubernetes verb the apiserver derives: get, list, watch,
	// create, update, patch, delete, deletecollection.
	Verb string
	// Namespace, Resource, Name and Subresource are parsed from Path, as
	// the apiserver does; Name is empty for a create on the collection.
	Namespace, Resource, Name, Subresource string
	// Status is the HTTP status the apiserver answered, or 0 if forwarding
	// failed (then Err says why).
	Status int
	// Err is the forwarding error, if any.
	Err string
	// Dropped is true when the apiserver's answer was withheld from the
	// client (see [Proxy.DropResponses]).
	Dropped bool
	// RetryAfter is the delay the apiserver asked for in a Retry-After
	// header (with 429 or 503), or 0.
	RetryAfter time.Duration
	// Received is when the proxy got the request from the client, and
	// Answered when the apiserver's answer (or the forwarding error)
	// reached the proxy: what happened at the server happened between the
	// two, and a client acts on the answer only after Answered.
	Received, Answered time.Time
}

// IsWrite tells whether the request asks for a change: any method but GET,
// HEAD and OPTIONS.
func (r Request) IsWrite() bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// Match selects requests, for [Proxy.DropResponses] and [Proxy.Count]. It
// sees the request before it is forwarded: Status, Err, Dropped,
// RetryAfter and Answered are zero.
type Match func(Request) bool

// MatchBinding matches a POST to pods/binding of the named pod.
func MatchBinding(namespace, pod string) Match {
	return func(r Request) bool {
		return r.Method == http.MethodPost && r.Resource == "pods" && r.Subresource == "binding" &&
			r.Namespace == namespace && r.Name == pod
	}
}

// MatchPodWrite matches a write (see [Request.IsWrite]) to the named pod or
// any of its subresources (binding, status, eviction, ...). A create of the
// pod is not matched: its path has no name.
func MatchPodWrite(namespace, pod string) Match {
	return func(r Request) bool {
		return r.IsWrite() && r.Resource == "pods" && r.Namespace == namespace && r.Name == pod
	}
}

// DropMode says how the proxy withholds a response.
type DropMode int

const (
	// AbortRequest aborts the one exchange: over HTTP/2 the stream is reset
	// (the client's connection and its other requests survive), over
	// HTTP/1.1 the connection is closed without a response.
	AbortRequest DropMode = iota
	// ResetConnection resets the client's TCP connection (SO_LINGER 0, so
	// the client reads ECONNRESET); with HTTP/2 every other request in
	// flight on that connection fails too, as on a real network fault.
	ResetConnection
)

// String returns the mode's name.
func (m DropMode) String() string {
	switch m {
	case AbortRequest:
		return "AbortRequest"
	case ResetConnection:
		return "ResetConnection"
	}
	return fmt.Sprintf("DropMode(%d)", int(m))
}

type dropRule struct {
	match Match
	left  int
	mode  DropMode
}

type connKey struct{}

// NewProxy starts a proxy to the apiserver that upstream reaches, and closes
// it when the test ends. Only upstream's host and TLS settings are used:
// clients send their own credentials, which the proxy forwards.
func NewProxy(t testing.TB, upstream *rest.Config) *Proxy {
	t.Helper()
	p, err := newProxy(upstream)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	t.Cleanup(p.close)
	return p
}

func newProxy(upstream *rest.Config) (*Proxy, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, fmt.Errorf("upstream host %q: %w", upstream.Host, err)
	}
	tlsConfig, err := rest.TLSConfigFor(&rest.Config{Host: upstream.Host, TLSClientConfig: upstream.TLSClientConfig})
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		upstream: target,
		// A transport of its own rather than client-go's shared cache, so
		// that closing the proxy closes its upstream connections.
		transport: &http.Transport{
			TLSClientConfig:     tlsConfig,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 64,
		},
		infos: &request.RequestInfoFactory{
			APIPrefixes:          sets.NewString("api", "apis"),
			GrouplessAPIPrefixes: sets.NewString("api"),
		},
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(p.upstream)
		},
		Transport:      p.transport,
		FlushInterval:  -1, // watches stream through at once
		ModifyResponse: p.recordResponse,
		ErrorHandler:   p.recordError,
		ErrorLog:       log.New(io.Discard, "", 0),
	}

	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serveHTTP))
	p.srv.EnableHTTP2 = true
	p.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, c)
	}
	p.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	p.srv.StartTLS()
	return p, nil
}

// URL is the proxy's base URL, https://127.0.0.1:PORT.
func (p *Proxy) URL() string { return p.srv.URL }

// ClientConfig returns a copy of base that reaches the apiserver through the
// proxy: Host and the TLS settings are the proxy's, and everything else
// (credentials, QPS, Burst, timeouts) is base's. Credentials must travel in
// headers (a bearer token, say): a client certificate ends at the proxy.
func (p *Proxy) ClientConfig(base *rest.Config) *rest.Config {
	c := rest.CopyConfig(base)
	c.Host = p.srv.URL
	c.TLSClientConfig = rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw}),
		// Keep a protocol choice: NextProtos: []string{"http/1.1"} forces
		// HTTP/1.1.
		NextProtos: base.TLSClientConfig.NextProtos,
	}
	c.Transport = nil
	return c
}

// DropResponses arms the proxy: the next times requests that m matches are
// forwarded, each is processed by the apiserver, whose answer is read in
// full and then withheld from the client as mode says. Rules armed earlier
// are tried first.
func (p *Proxy) DropResponses(m Match, times int, mode DropMode) {
	if times <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops = append(p.drops, &dropRule{match: m, left: times, mode: mode})
}

// Requests returns every request recorded so far, in the order their
// answers arrived.
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.log...)
}

// Filter returns the recorded requests that m matches, in order.
func (p *Proxy) Filter(m Match) []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Request
	for _, r := range p.log {
		if m(r) {
			out = append(out, r)
		}
	}
	return out
}

// Count returns how many recorded requests m matches.
func (p *Proxy) Count(m Match) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.log {
		if m(r) {
			n++
		}
	}
	return n
}

// PodWrites returns the recorded writes to the named pod and its
// subresources (see [MatchPodWrite]): the requests the apiserver received,
// whatever it answered and whether the client got the answer.
func (p *Proxy) PodWrites(namespace, pod string) []Request {
	return p.Filter(MatchPodWrite(namespace, pod))
}

// Reset forgets the recorded requests and disarms every drop rule.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = nil
	p.drops = nil
}

// requestState travels in the forwarded request's context, from serveHTTP
// to the recording hooks.
type requestState struct {
	rec  Request
	drop bool
}

type stateKey struct{}

func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	st := &requestState{rec: p.describe(r)}
	st.rec.Received = time.Now()
	// Have the whole body before forwarding anything. The apiserver may
	// answer before it reads the body (a 429 from its inflight limit), and
	// client-go's HTTP/2 transport stops sending a body once it sees an
	// answer above 299, without ending its stream: a body streamed through
	// would leave httputil.ReverseProxy waiting for the rest of it, unable
	// to end the answer, and the client waiting for that end — for ever.
	if r.Body != nil && r.Body != http.NoBody {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			st.rec.Err = "reading the request body: " + err.Error()
			p.record(st.rec)
			return // the client went away
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	var mode DropMode
	st.drop, mode = p.takeDrop(st.rec)
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))

	if !st.drop {
		p.rp.ServeHTTP(w, r)
		return
	}
	// Let the apiserver answer in full, into a writer nobody reads, then
	// fail the client's exchange.
	p.rp.ServeHTTP(discardWriter{h: http.Header{}}, r)
	if mode == ResetConnection {
		if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
			resetConn(c)
		}
	}
	panic(http.ErrAbortHandler) // net/http ends the exchange without a response
}

// takeDrop tells whether the first drop rule that matches rec withholds
// its response, and how; it counts the drop against the rule, which is
// disarmed when it has none left.
func (p *Proxy) takeDrop(rec Request) (drop bool, mode DropMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, d := range p.drops {
		if d.match(rec) {
			if d.left--; d.left == 0 {
				p.drops = append(p.drops[:i], p.drops[i+1:]...)
			}
			return true, d.mode
		}
	}
	return false, 0
}

// describe parses what the apiserver will see of r.
func (p *Proxy) describe(r *http.Request) Request {
	rec := Request{Method: r.Method, Path: r.URL.Path}
	if info, err := p.infos.NewRequestInfo(r); err == nil {
		rec.Verb = info.Verb
		rec.Namespace = info.Namespace
		rec.Resource = info.Resource
		rec.Name = info.Name
		rec.Subresource = info.Subresource
	}
	return rec
}

func (p *Proxy) recordResponse(resp *http.Response) error {
	if st, ok := resp.Request.Context().Value(stateKey{}).(*requestState); ok {
		st.rec.Status = resp.StatusCode
		st.rec.Dropped = st.drop
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			st.rec.RetryAfter = time.Duration(secs) * time.Second
		}
		p.record(st.rec)
	}
	return nil
}

func (p *Proxy) recordError(w http.ResponseWriter, r *http.Request, err error) {
	if st, ok := r.Context().Value(stateKey{}).(*requestState); ok {
		st.rec.Err = err.Error()
		st.rec.Dropped = st.drop
		p.record(st.rec)
	}
	if errors.Is(err, context.Canceled) {
		return // the client went away: nobody to answer
	}
	w.WriteHeader(http.StatusBadGateway)
}

func (p *Proxy) record(rec Request) {
	rec.Answered = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, rec)
}

// close stops the proxy: client connections are cut first, so that watches
// through it end and Close does not wait for them.
func (p *Proxy) close() {
	p.srv.CloseClientConnections()
	p.srv.Close()
	p.transport.CloseIdleConnections()
}

// resetConn closes the TCP connection under c with SO_LINGER 0, so that the
// peer gets a RST rather than an orderly close.
func resetConn(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = c.Close()
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header         { return d.h }
func (d discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d discardWriter) WriteHeader(int)             {}

// String summarizes the request for logs, such as
// "POST /api/v1/namespaces/ns/pods/p/binding -> 201 (dropped)".
func (r Request) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s -> ", r.Method, r.Path)
	if r.Err != "" {
		fmt.Fprintf(&b, "error %q", r.Err)
	} else {
		fmt.Fprintf(&b, "%d", r.Status)
	}
	if r.Dropped {
		b.WriteString(" (dropped)")
	}
	return b.String()
}
