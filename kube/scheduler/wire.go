package scheduler

import (
	"context"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coalescer/dispatch/kube/internal/retryafter"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// wire is how the adapter's calls reach the API server.
//
// The clientset a scheduler hands over carries client-go's token bucket,
// shared with its informers. Left where it is, that bucket sits behind the
// workers: a worker has chosen its call before it waits there, so a binding
// queues behind every status patch that holds a worker, and upstream's
// dispatcher, with a goroutine per call, puts it behind every queued patch
// (kubernetes#135900). So the adapter takes each execution's token from that
// same bucket itself, before the core chooses the call (gate), and runs the
// call on a clientset derived from the given one that has no bucket of its
// own (meter), and is otherwise the same (newWire). No request pays twice,
// and the total rate stays what the scheduler was configured with.
type wire struct {
	// client is what calls' Execute gets.
	client kubernetes.Interface
	// gate is the core's rate limiter: it opens when the dispatcher starts,
	// and then hands out the given client's tokens.
	gate *gate
	// metered says the tokens come from the given client's bucket and client
	// is the derived clientset: each execution's first request is paid for.
	metered bool
	// why says why the client could not be unwrapped, if it could not.
	why string
}

// newWire unwraps client, or falls back to using it as it is: a fake
// clientset, or a wrapper whose CoreV1 REST client is not a *rest.RESTClient,
// keeps its own rate limiting (if any) behind the workers, as with
// upstream's dispatcher. Priority still decides which call a free worker
// takes, and the reserved workers keep bindings moving; only the wait in
// the client's own bucket is out of order.
//
// The derived clientset sends the requests the given one would, but for
// the wait in its bucket: a clientset is a rest.Config's settings spread
// over its REST clients, and each is recovered from the core group's:
//
//   - the HTTP client, reused (only its transport is wrapped): credentials,
//     TLS, user agent, impersonation, proxy, compression — all of which
//     client-go puts in the transport — and the Timeout, which client-go
//     also sends as the requests' timeout parameter;
//   - the server URL with any path prefix (hostOf);
//   - the content type and the accepted types (contentOf; kube-scheduler's
//     clients speak protobuf). client-go keeps them unexported, with no
//     getter, so they are read by reflection; should a client-go release
//     move them, the client is used as it is rather than re-encoded;
//   - the limiter, which the gate and the meter stand in for.
//
// APIPath, GroupVersion and NegotiatedSerializer need no recovering: every
// typed client of a clientset sets its own. One setting is not kept: a
// warning handler of the client's own (rest.Config.WarningHandler or
// WarningHandlerWithContext). client-go holds it in an unexported interface
// field, whose value reflection cannot hand out, so the derived clientset's
// warnings go to the process's default handler (rest.SetDefaultWarningHandler)
// instead; kube-scheduler's clients set none of their own. (A client that
// may send CBOR also learns apart from the given one that a server refuses
// it.)
func newWire(client kubernetes.Interface) wire {
	w := wire{client: client, gate: newGate()}
	rc, ok := client.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		w.why = "its CoreV1 REST client is not a *rest.RESTClient"
		return w
	}
	host, ok := hostOf(rc)
	if !ok {
		w.why = "its REST client's URL does not end in /api/v1"
		return w
	}
	content, ok := contentOf(rc)
	if !ok {
		w.why = "its REST client's content type could not be read (a client-go this adapter does not know)"
		return w
	}
	hc := rc.Client
	if hc == nil {
		hc = http.DefaultClient
	}
	limiter := rc.GetRateLimiter()
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	derived := *hc
	derived.Transport = &meter{next: next, limiter: limiter, gate: w.gate}
	// QPS -1: client-go makes no bucket; the meter charges the given one.
	cs, err := kubernetes.NewForConfigAndClient(&rest.Config{Host: host, ContentConfig: content, QPS: -1}, &derived)
	if err != nil {
		w.why = "a clientset could not be derived from it: " + err.Error()
		return w
	}
	w.client, w.metered, w.gate.l = cs, true, limiter
	return w
}

// hostOf returns the server URL (with any path prefix) that rc's requests
// go to, from the URL of a request for the core group.
func hostOf(rc *rest.RESTClient) (string, bool) {
	u := rc.Get().URL()
	if u == nil {
		return "", false
	}
	prefix, ok := strings.CutSuffix(strings.TrimSuffix(u.Path, "/"), "/api/v1")
	if !ok {
		return "", false
	}
	h := url.URL{Scheme: u.Scheme, Host: u.Host, Path: prefix}
	return h.String(), true
}

// contentOf returns the content type and accepted types rc was built with,
// as a rest.Config carries them. client-go keeps them in the unexported
// rc.content.base, a rest.ClientContentConfig, and exports no way to read
// them (APIVersion gives the group version only), so they are read by
// reflection: read-only, without package unsafe. ok is false if rc does
// not hold them there.
//
// An empty ContentType stays empty, not client-go's default
// application/json: for built-in types, client-go asks for protobuf only
// when the client has no content type of its own.
func contentOf(rc *rest.RESTClient) (content rest.ContentConfig, ok bool) {
	v := reflect.ValueOf(rc).Elem().FieldByName("content")
	if v.Kind() != reflect.Struct {
		return content, false
	}
	v = v.FieldByName("base")
	if !v.IsValid() || v.Type() != reflect.TypeFor[rest.ClientContentConfig]() {
		return content, false
	}
	content.ContentType = v.FieldByName("ContentType").String()
	content.AcceptContentTypes = v.FieldByName("AcceptContentTypes").String()
	return content, true
}

// gate is the core's RateLimiter. It grants nothing before Start
// (upstream executes nothing before Run, while Add and SyncObject work on
// what is queued), then one token of the given client's bucket per
// execution, or every token if there is no bucket to take from.
//
// With a bucket, its tokens come only through Wait (Allow refuses them), so
// the core waits on it from one goroutine of its own and hands each token,
// when it is granted, to the best call ready at that moment: a binding
// added while the storm waits for tokens gets the next one. Waiting,
// rather than trying the bucket on a timer, keeps the dispatcher's place
// among the bucket's other users (the informers, the scheduler's own
// direct calls — preemption deletes its victims on the same clientset),
// which reserve their tokens in turn: a poller would be starved by any of
// them that waits continuously.
//
// client-go's bucket serves its waiters in the order they ask, so a user's
// share of it is the number of waits it keeps outstanding. One wait at a
// time would be one waiter's share, however many calls are queued: beside
// a dozen goroutines deleting preemption victims, a thirteenth of the
// bucket, where upstream's dispatcher, a goroutine per call, has a share
// per call. So the gate keeps a wait outstanding for each call waiting to
// run (demand, counted when the core asks for a token, and one more for
// each call added while it waits), up to maxShares — but not for the
// status patches beyond what the pacer lets run at once, which would only
// put their tokens ahead of the bucket's other users (Dispatcher.demand) —
// and banks each token
// granted until the core takes it for the best call ready then, or an
// execution's further request does (meter). A token is granted by the
// bucket before it is spent, never after, so the server sees no more
// requests than the bucket has granted; but tokens granted while every
// worker is busy (the server slow) are banked, and go out as workers free
// up, faster than the bucket's rate, at most as many as the waits that
// were outstanding. The waits end at Close.
type gate struct {
	opened chan struct{}
	once   sync.Once
	l      flowcontrol.RateLimiter // nil: no bucket to take from

	// shares is the most waits on l outstanding at once; 1 or less: one,
	// in the caller of Wait. demand returns the calls waiting to run. Set
	// both before open.
	shares int
	demand func() int

	bank   chan error    // each wait's result: nil, a token; capacity shares
	ask    chan struct{} // a wait to make, for a parked waiter; capacity shares
	active atomic.Bool   // bank is made: Add's hook has something to do
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	waits   int          // waits on l asked for and not yet ended
	waiters int          // goroutines that make them (waiter), parked when idle
	asking  atomic.Int32 // callers blocked in Wait; changed under mu, read without it by added
	closed  bool
}

// maxShares bounds the waits the gate keeps on the client's bucket: a
// goroutine each, blocked in the bucket's Wait. The goroutines are kept,
// parked, once the waits they made end: a call added waits on the bucket
// through one of them, and a goroutine starts only when more waits are
// outstanding than ever before.
const maxShares = 1024

func newGate() *gate { return &gate{opened: make(chan struct{})} }

// open lets tokens through, keeping waits on the bucket.
func (g *gate) open() {
	g.once.Do(func() {
		g.mu.Lock()
		if g.l != nil && g.shares > 1 && !g.closed {
			g.bank = make(chan error, g.shares)
			g.ask = make(chan struct{}, g.shares)
			g.ctx, g.cancel = context.WithCancel(context.Background())
			g.active.Store(true)
		}
		g.mu.Unlock()
		close(g.opened)
	})
}

// close ends the waits outstanding and waits for them to return. Tokens
// they were granted are not handed out.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	cancel := g.cancel
	g.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	g.wg.Wait()
}

// Wait blocks until the gate is open and a token is granted, or ctx ends.
func (g *gate) Wait(ctx context.Context) error {
	select {
	case <-g.opened:
	case <-ctx.Done():
		return ctx.Err()
	}
	if g.l == nil {
		return nil
	}
	if g.bank == nil {
		return g.l.Wait(ctx)
	}
	select {
	case err := <-g.bank:
		return err
	default:
	}
	want := 1
	if g.demand != nil {
		want = g.demand()
	}
	g.mu.Lock()
	asking := g.asking.Add(1)
	g.topUp(max(want, int(asking)))
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.asking.Add(-1)
		g.mu.Unlock()
	}()
	select {
	case err := <-g.bank:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Allow reports, without blocking, whether a token is granted now: once
// the gate is open with no bucket to take from, every token is, and the
// core's worker takes it itself instead of waiting for its goroutine that
// waits on the gate.
func (g *gate) Allow() bool {
	if g.l != nil {
		return false
	}
	select {
	case <-g.opened:
		return true
	default:
		return false
	}
}

// added says a call was added that waits to run: while the core waits for
// a token, it gets a wait of its own at once, as upstream's goroutine per
// call does, rather than at the next token.
func (g *gate) added() {
	if !g.active.Load() || g.asking.Load() == 0 {
		return // no bucket, one wait at a time, not started, or nobody waits for a token
	}
	g.mu.Lock()
	if g.asking.Load() > 0 {
		g.topUp(g.waits + len(g.bank) + 1)
	}
	g.mu.Unlock()
}

// topUp asks for waits on the bucket until want are outstanding or banked,
// up to shares, starting a waiter only when every one is busy. It is called
// with mu held. ask has room: the waits asked for never exceed shares.
func (g *gate) topUp(want int) {
	want = min(max(want, 1), g.shares)
	for !g.closed && g.waits+len(g.bank) < want {
		g.waits++
		g.ask <- struct{}{}
		if g.waiters < g.waits {
			g.waiters++
			g.wg.Add(1)
			go g.waiter()
		}
	}
}

// waiter makes the waits asked for, one at a time, until Close; each one's
// token, or its error, goes to the bank. The bank has room: waits + banked
// never exceed shares, its capacity, and both change under mu.
func (g *gate) waiter() {
	defer g.wg.Done()
	for {
		select {
		case <-g.ask:
		case <-g.ctx.Done():
			return
		}
		err := g.l.Wait(g.ctx)
		g.mu.Lock()
		g.waits--
		if g.ctx.Err() != nil {
			g.mu.Unlock()
			return // closing: nobody takes it
		}
		g.bank <- err
		g.mu.Unlock()
	}
}

// attempt is one execution's account with the meter, carried in the
// context Execute gets.
type attempt struct {
	prepaid    atomic.Bool  // the gate took this execution's first token
	retryAfter atomic.Int64 // the last response's Retry-After, in ns; 0: none
}

type attemptKey struct{}

// meter is the derived clientset's transport. It charges every request
// one token of the given client's bucket, except an execution's first,
// which the gate paid for before the call was chosen: so a call whose
// Execute retries inside itself (upstream's PodStatusPatchCall and
// PodBindingCall do, on 5xx, connection refused and conflicts) pays for
// every request it makes. And it keeps client-go's own retry loop out of
// the workers: a 429 or 5xx with Retry-After would otherwise be slept out
// and resent up to ten times inside the execution; the meter takes the
// header off (client-go retries only when it is there) and hands the delay
// to the dispatcher, which waits it out in its queue.
//
// A further request of an execution takes its token through the gate, as
// the core does: a token the gate has banked, or the next one its waits on
// the bucket are granted. Waiting on the bucket itself would put it behind
// every wait the gate keeps there, its worker held meanwhile, while the
// tokens granted to the gate piled up in its bank.
type meter struct {
	next    http.RoundTripper
	limiter flowcontrol.RateLimiter // nil: nothing to charge
	gate    *gate
}

func (m *meter) RoundTrip(req *http.Request) (*http.Response, error) {
	a, _ := req.Context().Value(attemptKey{}).(*attempt)
	if m.limiter != nil && (a == nil || !a.prepaid.CompareAndSwap(true, false)) {
		var l interface{ Wait(context.Context) error } = m.limiter
		if a != nil {
			l = m.gate // the dispatcher's own request: its tokens come through the gate
		}
		if err := l.Wait(req.Context()); err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
	}
	resp, err := m.next.RoundTrip(req)
	if a != nil {
		// The delay is this response's: a later response without one (a
		// success, another error) clears an earlier one's, which an error
		// Execute returns after it is no answer to.
		var delay time.Duration
		if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500) {
			if s, ok := retryafter.Header(resp.Header); ok {
				resp.Header.Del("Retry-After")
				delay = s
			}
		}
		a.retryAfter.Store(int64(delay))
	}
	return resp, err
}

// WrappedRoundTripper lets client-go's transport utilities see through
// the meter.
func (m *meter) WrappedRoundTripper() http.RoundTripper { return m.next }
