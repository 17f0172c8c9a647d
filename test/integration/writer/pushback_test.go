package writer_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
)

// fault is an answer the injector gives instead of the server's.
type fault struct {
	code       int
	reason     string
	retryAfter int // seconds; 0: no Retry-After
}

var (
	// An API Priority and Fairness rejection: 429 with Retry-After and the
	// delay in the Status's details too.
	apfReject   = fault{code: http.StatusTooManyRequests, reason: "TooManyRequests", retryAfter: 1}
	unavailable = fault{code: http.StatusServiceUnavailable, reason: "ServiceUnavailable", retryAfter: 1}
	internal    = fault{code: http.StatusInternalServerError, reason: "InternalError"}
)

func (f fault) response(req *http.Request) *http.Response {
	details := ""
	if f.retryAfter > 0 {
		details = fmt.Sprintf(`,"details":{"retryAfterSeconds":%d}`, f.retryAfter)
	}
	body := fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"injected %s","reason":%q%s,"code":%d}`,
		f.reason, f.reason, details, f.code)
	h := http.Header{"Content-Type": {"application/json"}}
	if f.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	return &http.Response{
		StatusCode: f.code, Status: fmt.Sprintf("%d %s", f.code, http.StatusText(f.code)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader([]byte(body))), ContentLength: int64(len(body)),
		Request: req,
	}
}

// attempt is one status write the injector saw.
type attempt struct {
	name     string
	at       time.Time // when the injector got it
	answered time.Time
	fault    *fault // nil: passed to the server
}

// injector sits in the writer's client, under writer.RESTConfig's own
// transport, and answers a widget's first status writes with the faults
// planned for it, as a server refusing them would; the rest go to the
// server, through the proxy.
type injector struct {
	next http.RoundTripper
	plan map[string][]fault // by widget name: the answers to its first writes
	// hold, if set, is called for each status write before it goes to the
	// server, with its 0-based attempt number.
	hold func(name string, n int)

	mu   sync.Mutex
	seen map[string]int
	log  []attempt
}

func (in *injector) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPut && req.Method != http.MethodPatch || path.Base(req.URL.Path) != "status" {
		return in.next.RoundTrip(req)
	}
	name := path.Base(path.Dir(req.URL.Path))
	in.mu.Lock()
	n := in.seen[name]
	in.seen[name]++
	a := attempt{name: name, at: time.Now()}
	if n < len(in.plan[name]) {
		f := in.plan[name][n]
		a.fault = &f
	}
	in.mu.Unlock()
	var (
		resp *http.Response
		err  error
	)
	if a.fault != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		resp = a.fault.response(req)
	} else {
		if in.hold != nil {
			in.hold(name, n)
		}
		resp, err = in.next.RoundTrip(req)
	}
	a.answered = time.Now()
	in.mu.Lock()
	in.log = append(in.log, a)
	in.mu.Unlock()
	return resp, err
}

func (in *injector) attempts() []attempt {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]attempt(nil), in.log...)
}

// inject returns a copy of cfg whose requests pass through in, for the
// writer's client (newWriter applies writer.RESTConfig above it).
func inject(cfg *rest.Config, in *injector) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { in.next = rt; return in })
	return c
}

// testPushback: the server answers first attempts with an APF 429 and
// Retry-After, a 503 with Retry-After, or two 500s. Every desire ends
// exactly once, Succeeded; each object's status is written at the server
// exactly once; each retry after a Retry-After comes no sooner than it
// asked, from the writer (client-go resends nothing itself); and retries
// wait in the queue, not in a worker.
func testPushback(t *testing.T, st *stack) {
	t.Run("every desire ends exactly once", func(t *testing.T) { pushbackOnce(t, st) })
	t.Run("a retry waits in the queue, not in a worker", func(t *testing.T) { pushbackQueue(t, st) })
}

func pushbackOnce(t *testing.T, st *stack) {
	const objects = 30
	ns := st.namespace(t, "pushback")
	cfg := st.controller(t, ns)
	objs := st.createWidgets(t, ns, "w", objects)
	ev := st.watch(t, ns)
	in := &injector{plan: map[string][]fault{}, seen: map[string]int{}}
	faults := 0
	for i, obj := range objs {
		plan := [][]fault{{apfReject}, {unavailable}, {internal, internal}}[i%3]
		in.plan[obj.GetName()] = plan
		faults += len(plan)
	}
	var (
		mu   sync.Mutex
		done = map[string]int{}
	)
	// Four refusals for three desires: more than the default retry budget
	// (one retry per first attempt in a window) allows, which would end the
	// excess Failed — once each, too. The budget is raised so that the
	// test can ask every desire to succeed.
	w := newWriter(t, inject(cfg, in), writer.Options[*U]{Workers: 4, Retry: dispatch.RetryPolicy{BudgetRatio: 2}, OnDone: func(r writer.Result[*U]) {
		mu.Lock()
		defer mu.Unlock()
		done[string(r.UID)]++
	}})

	tickets := make([]*writer.Ticket[*U], objects)
	for i, obj := range objs {
		var err error
		tickets[i], err = w.Submit(t.Context(), obj, writer.Desire[*U]{Status: setStatus(map[string]any{"phase": "written"})}, writer.SetOptions{})
		require.NoError(t, err)
	}
	for i, tk := range tickets {
		res := wait(t, tk)
		name := objs[i].GetName()
		assert.Equal(t, dispatch.StateSucceeded, res.State, "%s: %v", name, res.Err)
		assert.Equal(t, len(in.plan[name])+1, res.Attempts, "%s: attempts", name)
		assert.Equal(t, 1, res.Writes, "%s: writes accepted", name)
	}
	require.NoError(t, w.Close(t.Context()))
	ev.sync(t, st, ns)

	// Exactly once: one outcome per desire, one write per object at the
	// server, one change per object seen by the watch.
	accepted := map[string]int{}
	for _, r := range st.Proxy.Filter(isStatusWrite(ns)) {
		assert.Equal(t, 200, r.Status, "%v", r)
		accepted[r.Name]++
	}
	tries := map[string][]attempt{}
	for _, a := range in.attempts() {
		tries[a.name] = append(tries[a.name], a)
	}
	for _, obj := range objs {
		name := obj.GetName()
		assert.Equal(t, 1, done[string(obj.GetUID())], "%s: outcomes", name)
		assert.Equal(t, 1, accepted[name], "%s: status writes at the server", name)
		assert.Equal(t, 1, ev.count(name), "%s: changes seen by the watch", name)
		assert.Equal(t, "written", statusOf(st.get(t, ns, name), "phase"), name)
		// Each attempt after a refusal came no sooner than the refusal
		// asked; attempts at the injector are the writer's own (as many as
		// its outcome counts, checked above): client-go resent nothing.
		a := tries[name]
		require.Len(t, a, len(in.plan[name])+1, name)
		for j := 1; j < len(a); j++ {
			if f := a[j-1].fault; f != nil && f.retryAfter > 0 {
				wait := a[j].at.Sub(a[j-1].answered)
				assert.GreaterOrEqual(t, wait, time.Duration(f.retryAfter)*time.Second,
					"%s: retried %v after a %d asking for %ds", name, wait, f.code, f.retryAfter)
			}
		}
	}
	s := w.Stats()
	assert.Equal(t, uint64(faults), s.Dispatch.Retries, "retries against refusals")
	assert.Equal(t, uint64(objects), s.Dispatch.Outcomes[dispatch.StateSucceeded])
	t.Logf("%d desires, %d refusals injected (429 and 503 with Retry-After: 1, 500): %d retries, %d status writes accepted, every desire Succeeded once",
		objects, faults, s.Dispatch.Retries, len(st.Proxy.Filter(isStatusWrite(ns))))
}

// pushbackQueue: with one worker, object A's first write is refused (429,
// Retry-After: 1) and its retry is held at the client until object B's write
// has gone out. B is submitted only after A's refusal. If A's retry waited
// in the worker — client-go sleeping the Retry-After out and resending, or
// the writer sleeping its backoff — B could never be sent and A's retry
// never released: the test would time out. It ends because the worker was
// free while A waited in the queue.
func pushbackQueue(t *testing.T, st *stack) {
	ns := st.namespace(t, "pushback-queue")
	cfg := st.controller(t, ns)
	objs := st.createWidgets(t, ns, "w", 2)
	a, b := objs[0], objs[1]
	bSent := make(chan struct{})
	in := &injector{plan: map[string][]fault{a.GetName(): {apfReject}}, seen: map[string]int{}}
	in.hold = func(name string, n int) {
		switch {
		case name == b.GetName():
			close(bSent)
		case name == a.GetName() && n == 1:
			select {
			case <-bSent:
			case <-time.After(callTimeout):
			}
		}
	}
	w := newWriter(t, inject(cfg, in), writer.Options[*U]{Workers: 1})
	w2 := func(obj *U) *writer.Ticket[*U] {
		tk, err := w.Submit(t.Context(), obj, writer.Desire[*U]{Status: setStatus(map[string]any{"phase": "written"})}, writer.SetOptions{})
		require.NoError(t, err)
		return tk
	}
	ta := w2(a)
	require.Eventually(t, func() bool {
		for _, at := range in.attempts() {
			if at.name == a.GetName() && at.fault != nil {
				return true
			}
		}
		return false
	}, callTimeout, 5*time.Millisecond, "A's first write was not refused")
	tb := w2(b)
	rb := wait(t, tb)
	ra := wait(t, ta)
	assert.Equal(t, dispatch.StateSucceeded, rb.State, "B: %v", rb.Err)
	assert.Equal(t, dispatch.StateSucceeded, ra.State, "A: %v", ra.Err)
	var order []string
	for _, at := range in.attempts() {
		s := at.name
		if at.fault != nil {
			s += fmt.Sprintf(" (%d)", at.fault.code)
		}
		order = append(order, s)
	}
	assert.Equal(t, []string{a.GetName() + " (429)", b.GetName(), a.GetName()}, order,
		"status writes in the order the client sent them")
}
