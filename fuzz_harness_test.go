package dispatch_test

// The harness for FuzzQueueModel: the real Dispatcher, driven in step with
// the model, and compared with it after every step.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
)

type fzExec struct {
	key      int
	val      int64
	deadline int64
	release  chan int
	returned bool
}

type fzTicket struct {
	tk     *dispatch.Ticket[int, int64]
	m      *fmTicket
	op     int // index of the op that submitted it
	cancel func()
	cause  error // what cancel cancels with
	seen   bool
	res    dispatch.Result[int, int64]
}

type fzHarness struct {
	t     *testing.T
	cfg   fzConfig
	m     *fzModel
	d     *dispatch.Dispatcher[int, int64]
	t0    time.Time
	trace []string

	mu    sync.Mutex // guards execs and hooks
	execs []*fzExec
	hooks []dispatch.Result[int, int64]

	nHooks, nModelHooks int
	tickets             []*fzTicket
	ctxCancels          []func()

	closeStarted  bool
	closeCancel   context.CancelFunc
	closeDone     chan error
	closeReturned bool
	tearingDown   bool
}

// fzRun runs one input, and returns the rules it exercised (fzModel.notes).
func fzRun(t *testing.T, data []byte) []string {
	r := &fzReader{b: data}
	cfg := fzDecodeConfig(r)
	h := &fzHarness{t: t, cfg: cfg, m: newFzModel(cfg), closeDone: make(chan error, 1)}
	h.trace = append(h.trace, "config: "+cfg.String())
	dc := dispatch.Config[int, int64]{
		Workers:    1,
		Capacity:   cfg.capacity,
		MaxWaiters: cfg.maxWaiters,
		Aging:      cfg.aging,
		AgingBand:  cfg.band,
		// The model does not predict which calls the start check would
		// judge unfinishable; that rule has tests of its own.
		Start: dispatch.StartPolicy{NoDeadlineCheck: true},
		OnDone: func(r dispatch.Result[int, int64]) {
			h.mu.Lock()
			h.hooks = append(h.hooks, r)
			h.mu.Unlock()
		},
		Classify: func(err error) dispatch.Class {
			switch {
			case errors.Is(err, errFuzzRetry):
				return dispatch.ClassRetry
			case errors.Is(err, errFuzzRecompute):
				return dispatch.ClassRecompute
			}
			return dispatch.ClassPermanent
		},
		Retry: dispatch.RetryPolicy{
			MaxAttempts:    cfg.maxAttempts,
			InitialBackoff: fzBackoff,
			MaxBackoff:     fzMaxBackoff,
			Multiplier:     2,
			Jitter:         dispatch.JitterNone,
			BudgetRatio:    math.Inf(1),
		},
	}
	if cfg.breaker {
		dc.Breaker = &dispatch.BreakerPolicy{
			ConsecutiveFailures: cfg.brFailures,
			FailureRatio:        math.Inf(1),
			Cooldown:            fzCooldown,
			Probes:              1,
			RefuseDroppable:     cfg.brRefuse,
		}
	}
	if cfg.merge != 0 {
		mode := cfg.merge
		dc.Merge = func(p, in int64) (int64, error) { return fzMerge(mode, p, in) }
	}
	if cfg.labels {
		dc.Label = func(_ int, v int64) string { return fzLabel(v) }
	}
	if cfg.follow {
		dc.Follow, dc.Moot = fzFollow, fzMoot
	}
	if cfg.tenants {
		dc.Tenants = map[string]dispatch.TenantConfig{}
		for i, name := range fzTenantNames {
			dc.Tenants[name] = dispatch.TenantConfig{MaxQueued: cfg.quota[i], Weight: cfg.weight[i]}
		}
	}
	if cfg.noop {
		dc.NoOp = func(_ int, v int64) bool { return v%5 == 0 }
	}
	if cfg.before {
		dc.BeforeRetry = func(_ context.Context, _ int, v int64, _ error) (int64, bool, error) {
			switch {
			case v%7 == 0:
				return 0, true, nil
			case v%11 == 0:
				return 0, false, errFuzzBefore
			}
			return v + 1000, false, nil
		}
	}
	h.t0 = time.Now()
	d, err := dispatch.New(h.exec, dc)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.d = d
	for i := 0; i < fzMaxOps && r.more(); i++ {
		op := fzDecodeOp(r)
		h.apply(i, op)
	}
	h.finalize()
	if os.Getenv("DISPATCH_FUZZ_TRACE") != "" {
		t.Logf("ops:\n  %s\nhooks: %v\nrules: %q", strings.Join(h.trace, "\n  "), h.m.hooks, h.m.notes)
	}
	return h.m.notes
}

// fzMerge is the merge function of merge mode 1 (sum), 2 (sum that refuses
// incoming multiples of 3) and 3 (mode 2, but incoming multiples of 4 are
// moot: SkipIncoming, wrapped for multiples of 8).
func fzMerge(mode int, p, in int64) (int64, error) {
	switch {
	case mode == 3 && in%8 == 0:
		return 0, fmt.Errorf("fuzz: %d is moot: %w", in, dispatch.SkipIncoming)
	case mode == 3 && in%4 == 0:
		return 0, dispatch.SkipIncoming
	case mode == 3 && in%14 == 0:
		return in, fmt.Errorf("fuzz: %d is another operation: %w", in, dispatch.ReplacePending)
	case mode == 3 && in%7 == 0:
		return in, dispatch.ReplacePending
	case mode >= 2 && in%3 == 0:
		return 0, errFuzzMerge
	}
	return p + in, nil
}

// fzMoot is Config.Moot with follow on: a submission for a key without a
// call is moot if its value is a multiple of 23, and Moot panics for a
// multiple of 29.
func fzMoot(_ int, v int64) bool {
	if v%29 == 0 {
		panic(fmt.Sprintf("fuzz: moot panics for %d", v))
	}
	return v%23 == 0
}

// fzFollow is Config.Follow with follow on. Incoming multiples of 9 are
// moot behind the call in flight (SkipIncoming, wrapped for multiples of
// 18), multiples of 13 are refused, and multiples of 17 panic while a call
// is also pending; any other value goes on rewritten from the running one,
// one way when a call is pending (and then merged into it) and another
// when the submission becomes the successor. Values stay small: a
// submission's own is its op's index + 1.
func fzFollow(running, incoming int64, pending bool) (int64, error) {
	switch {
	case incoming%18 == 0:
		return 0, fmt.Errorf("fuzz: %d is moot behind %d: %w", incoming, running, dispatch.SkipIncoming)
	case incoming%9 == 0:
		return 0, dispatch.SkipIncoming
	case incoming%13 == 0:
		return 0, fmt.Errorf("fuzz: %d behind %d: %w", incoming, running, errFuzzFollow)
	case incoming%17 == 0 && pending:
		panic(fmt.Sprintf("fuzz: follow panics for %d behind %d", incoming, running))
	case pending:
		return incoming + 10000*(running%100), nil
	}
	return incoming + 100*(running%100), nil
}

// fzLabel is the label of a submission of value v, with labels on.
func fzLabel(v int64) string { return [...]string{"L0", "L1", "L2"}[v%3] }

func (h *fzHarness) exec(ctx context.Context, key int, val int64) error {
	e := &fzExec{key: key, val: val, release: make(chan int, 1)}
	if dl, ok := ctx.Deadline(); ok {
		e.deadline = int64(dl.Sub(h.t0))
	}
	h.mu.Lock()
	h.execs = append(h.execs, e)
	h.mu.Unlock()
	var result int
	if h.cfg.honour {
		select {
		case result = <-e.release:
		case <-ctx.Done():
			h.mu.Lock()
			e.returned = true
			h.mu.Unlock()
			return context.Cause(ctx)
		}
	} else {
		result = <-e.release
	}
	h.mu.Lock()
	e.returned = true
	h.mu.Unlock()
	switch result {
	case fzPerm:
		return fmt.Errorf("key %d: %w", key, errFuzzPerm)
	case fzRetry:
		return fmt.Errorf("key %d: %w", key, errFuzzRetry)
	case fzRecompute:
		return fmt.Errorf("key %d: %w", key, errFuzzRecompute)
	case fzPanic:
		panic(fmt.Sprintf("fuzz exec panic, key %d", key))
	}
	return nil
}

func (h *fzHarness) fail(format string, args ...any) {
	h.t.Helper()
	msg := fmt.Sprintf(format, args...)
	h.teardown()
	h.t.Fatalf("%s\n\nops:\n  %s", msg, strings.Join(h.trace, "\n  "))
}

// teardown closes the dispatcher however it is, so that the bubble can end.
func (h *fzHarness) teardown() {
	if h.tearingDown {
		return
	}
	h.tearingDown = true
	if !h.closeStarted {
		h.startClose()
	}
	h.closeCancel()
	for range 1000 {
		synctest.Wait()
		select {
		case <-h.closeDone:
			h.closeReturned = true
		default:
		}
		if h.closeReturned {
			break
		}
		h.mu.Lock()
		for _, e := range h.execs {
			if !e.returned && len(e.release) == 0 {
				e.release <- fzOK
			}
		}
		h.mu.Unlock()
	}
	for _, c := range h.ctxCancels {
		c()
	}
}

func (h *fzHarness) startClose() {
	h.closeStarted = true
	ctx, cancel := context.WithCancel(context.Background())
	h.closeCancel = cancel
	go func() { h.closeDone <- h.d.Close(ctx) }()
}

func (h *fzHarness) apply(i int, op fzOp) {
	m := h.m
	val := int64(i + 1)
	if !h.cfg.tenants {
		op.tenant = 0 // the bits mean nothing without tenants
	}
	h.trace = append(h.trace, fmt.Sprintf("%2d @%v: %v", i, time.Duration(m.now), op))
	switch op.kind {
	case fzSubmit:
		var o dispatch.SubmitOptions
		o.Priority, o.Generation, o.IdempotencyKey, o.Droppable = op.prio, op.gen, op.idem, op.drop
		o.Tenant = fzTenantNames[op.tenant]
		var deadline int64 // absolute; meaningful only with hasDL
		hasDL := op.hasDL
		if hasDL {
			deadline = m.now + int64(op.dl)
			h.deadlineOpt(&o, i, op.dl, deadline)
		}
		ctx := context.Background()
		var cancel func()
		var cause, early error
		switch op.ctxKind {
		case fzCtxCancelable:
			c, cf := context.WithCancelCause(ctx)
			cause = fmt.Errorf("fuzz: ctx of op %d cancelled", i)
			ctx, cancel = c, func() { cf(cause) }
		case fzCtxDeadline:
			at := m.now + int64(op.ctxDL)
			ctxAt := at
			if h.cfg.tenants {
				// The context's own timer would race the clock at its
				// deadline, and with tenants the order of what ends at
				// one instant shows (FuzzQueueModel): the deadline is the
				// submission's, the context's a nanosecond later.
				ctxAt++
				if !hasDL || at < deadline {
					o.Deadline = h.t0.Add(time.Duration(at))
				}
			}
			c, cf := context.WithDeadline(ctx, h.t0.Add(time.Duration(ctxAt)))
			ctx, cancel, cause = c, cf, context.Canceled
			if at <= m.now {
				early = dispatch.ErrExpired // the context is done already
			}
			if !hasDL || at < deadline {
				hasDL, deadline = true, at
			}
		case fzCtxDone:
			c, cf := context.WithCancel(ctx)
			cf()
			ctx, cancel = c, cf
			early = dispatch.ErrCanceled
		}
		if cancel != nil {
			h.ctxCancels = append(h.ctxCancels, cancel)
		}
		if early == nil && hasDL && deadline <= m.now {
			early = dispatch.ErrExpired
		}
		if !hasDL {
			deadline = 0
		}
		mt := &fmTicket{key: op.key}
		want := m.submit(op, val, deadline, early, mt)
		tk, err := h.d.Submit(ctx, op.key, val, o)
		h.compareErr("Submit", err, want)
		if want == nil && tk != nil {
			mt.ctxLive = op.ctxKind == fzCtxCancelable || op.ctxKind == fzCtxDeadline
			h.tickets = append(h.tickets, &fzTicket{tk: tk, m: mt, op: i, cancel: cancel, cause: cause})
		}
	case fzPost:
		var o dispatch.SubmitOptions
		o.Priority, o.Generation, o.IdempotencyKey, o.Droppable = op.prio, op.gen, op.idem, op.drop
		o.Tenant = fzTenantNames[op.tenant]
		var deadline int64
		var early error
		if op.hasDL {
			deadline = m.now + int64(op.dl)
			h.deadlineOpt(&o, i, op.dl, deadline)
			if deadline <= m.now {
				early = dispatch.ErrExpired
			}
		}
		want := m.submit(op, val, deadline, early, nil)
		err := h.d.Post(op.key, val, o)
		h.compareErr("Post", err, want)
	case fzTicketCancel:
		if len(h.tickets) == 0 {
			break
		}
		ft := h.tickets[op.idx%len(h.tickets)]
		h.trace[len(h.trace)-1] += fmt.Sprintf(" = ticket of op %d", ft.op)
		ft.tk.Cancel()
		m.leave(ft.m, dispatch.StateCanceled, "canceled", nil)
	case fzCtxCancel:
		if len(h.tickets) == 0 {
			break
		}
		ft := h.tickets[op.idx%len(h.tickets)]
		h.trace[len(h.trace)-1] += fmt.Sprintf(" = ticket of op %d", ft.op)
		if ft.cancel != nil {
			ft.cancel()
		}
		if ft.m.ctxLive {
			ft.m.ctxLive = false
			m.leave(ft.m, dispatch.StateCanceled, "canceled", ft.cause)
		}
	case fzCancelKey:
		cause := fmt.Errorf("fuzz: Cancel in op %d", i)
		got := h.d.Cancel(op.key, cause)
		if want := m.cancelKey(op.key, cause); got != want {
			h.fail("step %d: Cancel(k%d) = %v, model says %v", i, op.key, got, want)
		}
	case fzAdvance:
		time.Sleep(op.dur)
		m.advance(m.now + int64(op.dur))
	case fzFinish:
		if m.running == nil {
			break
		}
		h.releaseRunning(op.result)
		m.release(op.result)
	case fzClose:
		if !h.closeStarted {
			h.startClose()
			m.close()
		}
	case fzCloseAbort:
		if h.closeStarted {
			h.closeCancel()
			m.abort()
		}
	}
	m.work()
	h.check(fmt.Sprintf("step %d (%v)", i, op))
}

func (h *fzHarness) releaseRunning(result int) {
	h.mu.Lock()
	var open []*fzExec
	for _, e := range h.execs {
		if !e.returned {
			open = append(open, e)
		}
	}
	h.mu.Unlock()
	if len(open) != 1 {
		h.fail("the model has a call in flight, the dispatcher has %d unreturned exec calls", len(open))
	}
	open[0].release <- result
}

// deadlineOpt sets o's deadline, at (on the model's clock), dl from now:
// as SubmitOptions.Timeout for every other op (a Timeout of 0 is none),
// else as SubmitOptions.Deadline.
func (h *fzHarness) deadlineOpt(o *dispatch.SubmitOptions, i int, dl time.Duration, at int64) {
	if dl != 0 && i%2 == 1 {
		o.Timeout = dl
		return
	}
	o.Deadline = h.t0.Add(time.Duration(at))
}

func (h *fzHarness) compareErr(what string, got, want error) {
	h.t.Helper()
	switch {
	case want == nil && got != nil:
		h.fail("%s: %v, model accepts it", what, got)
	case want != nil && got == nil:
		h.fail("%s accepted, model says %v", what, want)
	case want != nil && !fzMatches(got, want):
		h.fail("%s: %v, model says %v", what, got, want)
	}
}

// fzMatches reports whether got is the error the model expects (see fzAll).
func fzMatches(got, want error) bool {
	all, ok := want.(fzAll)
	if !ok {
		all = fzAll{want}
	}
	for _, w := range all {
		var be *dispatch.BackpressureError
		var pe *dispatch.PanicError
		switch w := w.(type) {
		case *dispatch.BackpressureError:
			if !errors.As(got, &be) || be.Bound != w.Bound {
				return false
			}
		case fzPanicIn:
			if !errors.As(got, &pe) || pe.Callback != string(w) {
				return false
			}
		default:
			if !errors.Is(got, w) {
				return false
			}
		}
	}
	return true
}

// finalize closes the dispatcher (draining, or ending Close's context at
// once) and checks that everything ended.
func (h *fzHarness) finalize() {
	m := h.m
	if !h.closeStarted {
		h.trace = append(h.trace, "final: Close")
		h.startClose()
		m.close()
		m.work()
		h.check("final Close")
	}
	if !h.cfg.drainClose {
		h.trace = append(h.trace, "final: end Close's context")
		h.closeCancel()
		m.abort()
		m.work()
		h.check("final abort")
	}
	for i := 0; !h.closeReturned; i++ {
		switch {
		case i > 10*fzMaxOps:
			h.fail("Close does not return")
		case m.running != nil:
			h.trace = append(h.trace, "final: finish running exec: ok")
			h.releaseRunning(fzOK)
			m.release(fzOK)
			m.work()
			h.check("final finish")
		case m.nextEvent() != 0:
			dur := m.nextEvent() - m.now
			h.trace = append(h.trace, fmt.Sprintf("final: advance %v", time.Duration(dur)))
			time.Sleep(time.Duration(dur))
			m.advance(m.now + dur)
			h.check("final advance")
		default:
			h.fail("model: Close cannot return, nothing runs and nothing waits")
		}
	}
	s := h.d.Stats()
	if s.Live != 0 || s.Keys != 0 || s.InFlight != 0 || s.Tickets != 0 {
		h.fail("after Close: %+v", s)
	}
	for _, ft := range h.tickets {
		if !ft.seen {
			h.fail("after Close: ticket of op %d is not done", ft.op)
		}
	}
	// Close is idempotent.
	if err := h.d.Close(context.Background()); err != nil {
		h.fail("second Close: %v", err)
	}
	for _, c := range h.ctxCancels {
		c()
	}
}

func (h *fzHarness) check(step string) {
	h.t.Helper()
	synctest.Wait()
	m := h.m
	h.mu.Lock()
	execs := slices.Clone(h.execs)
	var snap []fzStart
	for _, e := range execs {
		snap = append(snap, fzStart{key: e.key, val: e.val, deadline: e.deadline})
	}
	hooks := slices.Clone(h.hooks[h.nHooks:])
	h.nHooks = len(h.hooks)
	h.mu.Unlock()

	// Executions started, in order.
	if !slices.Equal(snap, m.starts) {
		h.fail("%s: exec calls\n  got  %v\n  want %v", step, snap, m.starts)
	}

	// Completion hook, as a multiset.
	var got, want []string
	for _, r := range hooks {
		got = append(got, fzHookRec{key: r.Key, state: r.State, val: r.Call, attempts: r.Attempts, waiters: r.Waiters, class: fzErrClass(r.Err)}.String())
		if r.QueueWait < 0 || r.RunTime < 0 {
			h.fail("%s: hook result with negative duration: %+v", step, r)
		}
	}
	for _, r := range m.hooks[h.nModelHooks:] {
		want = append(want, r.String())
	}
	h.nModelHooks = len(m.hooks)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		h.fail("%s: completion hook\n  got  %v\n  want %v", step, got, want)
	}

	// Tickets.
	for _, ft := range h.tickets {
		done := false
		select {
		case <-ft.tk.Done():
			done = true
		default:
		}
		mt := ft.m
		if done != mt.done {
			h.fail("%s: ticket of op %d: done=%v, model says %v (model state %v)", step, ft.op, done, mt.done, mt.state)
		}
		if !done {
			if _, ok := ft.tk.Result(); ok {
				h.fail("%s: ticket of op %d: Result ok before Done", step, ft.op)
			}
			continue
		}
		res, ok := ft.tk.Result()
		if !ok {
			h.fail("%s: ticket of op %d: Done closed but Result not ok", step, ft.op)
		}
		if ft.seen {
			if res.State != ft.res.State || res.Call != ft.res.Call || res.Err != ft.res.Err {
				h.fail("%s: ticket of op %d: outcome changed from %+v to %+v", step, ft.op, ft.res, res)
			}
			continue
		}
		ft.seen, ft.res = true, res
		wres, werr := ft.tk.Wait(context.Background())
		if wres.State != res.State || werr != res.Err {
			h.fail("%s: ticket of op %d: Wait = %v, %v; Result = %+v", step, ft.op, wres.State, werr, res)
		}
		class := fzErrClass(res.Err)
		exact := res.Call == mt.val && res.Attempts == mt.attempts
		alt := mt.hasAlt && res.Call == mt.altVal && res.Attempts == mt.altAttempt
		bad := res.Key != mt.key || res.State != mt.state || !(exact || alt) ||
			res.Waiters != mt.waiters || class != mt.class ||
			res.QueueWait < 0 || res.RunTime < 0
		if bad {
			h.fail("%s: ticket of op %d:\n  got  k%d %v val=%d waiters=%d attempts=%d err=%s (%v)\n  want k%d %v val=%d waiters=%d attempts=%d err=%s",
				step, ft.op, res.Key, res.State, res.Call, res.Waiters, res.Attempts, class, res.Err,
				mt.key, mt.state, mt.val, mt.waiters, mt.attempts, mt.class)
		}
		if mt.cause != nil && !errors.Is(res.Err, mt.cause) {
			h.fail("%s: ticket of op %d: error %v does not match the cause %v", step, ft.op, res.Err, mt.cause)
		}
	}

	// Stats.
	s := h.d.Stats()
	ws := dispatch.Stats{
		Keys:            len(m.slots),
		Ready:           m.count(fmReady),
		Delayed:         m.count(fmDelayed),
		Successors:      m.successors(),
		Tickets:         m.tickets,
		Live:            m.tickets + m.liveFF,
		Submitted:       m.submitted,
		Rejected:        m.rejected,
		Coalesced:       m.coalesced,
		Executions:      m.executions,
		StaleExecutions: m.staleExecs,
		Retries:         m.retries,
		AlreadyDone:     m.alreadyDone,
		Circuit:         m.circuitAsFound(),
		Outcomes:        m.outcomes,
		Calls:           m.callsBy,
		Concurrency:     1, // one worker, no adaptive limit
	}
	if m.running != nil {
		ws.InFlight = 1
	}
	if want := m.labels(); !maps.Equal(s.Labels, want) || (s.Labels == nil) != (want == nil) {
		h.fail("%s: Stats.Labels %v, model says %v", step, s.Labels, want)
	}
	ws.Backpressure, ws.Shed, ws.Tenants = m.refused, m.shedBy, map[string]dispatch.TenantStats{}
	for _, t := range m.tenants {
		ts := dispatch.TenantStats{Queued: m.queued(t), Admitted: t.admitted, Rejected: t.rejected, Dropped: t.dropped}
		if m.running != nil && m.running.ten == t {
			ts.InFlight = 1
		}
		ws.Tenants[t.name] = ts
		if t.maxQueued > 0 && s.Tenants[t.name].Queued > t.maxQueued {
			h.fail("%s: tenant %q has %d calls queued, over its MaxQueued %d", step, t.name, s.Tenants[t.name].Queued, t.maxQueued)
		}
	}
	if err := m.consistent(); err != nil {
		h.fail("%s: model: %v", step, err)
	}
	s.Labels = nil
	// Latency distributions are not modelled; their counts are.
	if s.ExecTime.Count != s.Executions {
		h.fail("%s: ExecTime.Count %d != Executions %d", step, s.ExecTime.Count, s.Executions)
	}
	s.QueueWait, s.ExecTime = dispatch.Quantiles{}, dispatch.Quantiles{}
	if !reflect.DeepEqual(s, ws) {
		h.fail("%s: Stats\n  got  %+v\n  want %+v", step, s, ws)
	}
	sum := total(s.Outcomes)
	if s.Submitted != s.Rejected+sum+uint64(s.Live) {
		h.fail("%s: conservation: Submitted %d != Rejected %d + Σ Outcomes %d + Live %d", step, s.Submitted, s.Rejected, sum, s.Live)
	}
	if m.calls != s.Ready+s.Delayed+s.Successors+s.InFlight {
		h.fail("%s: model calls %d != ready+delayed+successors+inflight in %+v", step, m.calls, s)
	}
	for k := range fzKeys {
		_, want := m.slots[k]
		if got := h.d.Busy(k); got != want {
			h.fail("%s: Busy(k%d) = %v, model says %v", step, k, got, want)
		}
	}

	// Close.
	if h.closeStarted && !h.closeReturned {
		select {
		case err := <-h.closeDone:
			h.closeReturned = true
			if !m.closeReturned() {
				h.fail("%s: Close returned %v, the model says it is still waiting", step, err)
			}
			if !errors.Is(err, m.closeErr) || (err == nil) != (m.closeErr == nil) {
				h.fail("%s: Close returned %v, model says %v", step, err, m.closeErr)
			}
		default:
			if m.closeReturned() {
				h.fail("%s: Close has not returned, the model says it has", step)
			}
		}
	}
}

// total sums Stats.Outcomes or Stats.Calls.
func total(c map[dispatch.State]uint64) uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}
