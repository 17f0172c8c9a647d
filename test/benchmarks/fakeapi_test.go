package benchmarks

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// fakeAPI stands in for an API server and the client in front of it, for
// the storm benchmark. Every request takes a fixed latency. An optional
// client-side token bucket is waited on before a request leaves, as a
// clientset's own rate limiter would: the waiting happens inside exec, on
// the dispatcher's worker. An optional throttle window makes the server
// answer every request that arrives in it with 429 and a Retry-After hint.
// It records when each request arrived and when each succeeded, so that
// rates can be measured over any window afterwards.
//
// A fakeAPI is safe for concurrent use. Its zero value is a server with no
// latency, no client bucket and no throttling.
type fakeAPI struct {
	latency    time.Duration
	client     *rate.Limiter // nil: the client does not limit
	throttle   window        // requests arriving in it get 429; zero: never
	retryAfter time.Duration // the 429's hint

	mu       sync.Mutex
	start    time.Time       // the origin of the recorded offsets
	arrivals []time.Duration // per request that reached the server
	oks      []time.Duration // per request the server answered 2xx, at its end
}

// window is a span of time, as offsets from the start of a scenario.
type window struct{ from, to time.Duration }

func (w window) zero() bool                    { return w.to <= w.from }
func (w window) contains(t time.Duration) bool { return w.from <= t && t < w.to }
func (w window) length() time.Duration         { return w.to - w.from }
func (w window) count(ts []time.Duration) (n int) {
	for _, t := range ts {
		if w.contains(t) {
			n++
		}
	}
	return n
}

// tooManyRequests is the server's 429. Its RetryAfter method makes
// dispatch.DefaultClassifier judge it retryable and the dispatcher wait the
// hinted delay before the retry.
type tooManyRequests struct{ after time.Duration }

func (tooManyRequests) Error() string               { return "fake API: 429 Too Many Requests" }
func (e tooManyRequests) RetryAfter() time.Duration { return e.after }

// begin sets the origin of the recorded offsets: the start of the storm.
func (a *fakeAPI) begin(start time.Time) {
	a.mu.Lock()
	a.start = start
	a.mu.Unlock()
}

// do performs one request: the client's bucket, then the round trip.
func (a *fakeAPI) do(ctx context.Context) error {
	if a.client != nil {
		if err := a.client.Wait(ctx); err != nil {
			return err
		}
	}
	a.mu.Lock()
	at := time.Since(a.start)
	a.arrivals = append(a.arrivals, at)
	a.mu.Unlock()
	if a.latency > 0 {
		t := time.NewTimer(a.latency)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	// The server decides on arrival; the answer takes the round trip.
	if a.throttle.contains(at) {
		return tooManyRequests{after: a.retryAfter}
	}
	a.mu.Lock()
	a.oks = append(a.oks, time.Since(a.start))
	a.mu.Unlock()
	return nil
}

// requests returns the number of requests that reached the server.
func (a *fakeAPI) requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.arrivals)
}

// requestsIn returns the number of requests that reached the server in w.
func (a *fakeAPI) requestsIn(w window) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return w.count(a.arrivals)
}

// recovery returns how long after the throttle window ended the server's
// success rate was back to 90% of qps: the time from the end to the first
// moment — the end itself or a success after it — that begins a span of
// length span holding at least 0.9 × qps × span successes. If no span does
// (the backlog ran out first), it returns the time from the end to the last
// success. It needs a throttle window.
func (a *fakeAPI) recovery(qps float64, span time.Duration) time.Duration {
	a.mu.Lock()
	oks := slices.Clone(a.oks)
	a.mu.Unlock()
	slices.Sort(oks)
	want := int(0.9 * qps * span.Seconds())
	end := a.throttle.to
	starts := []time.Duration{end}
	for _, t := range oks {
		if t > end {
			starts = append(starts, t)
		}
	}
	for _, t := range starts {
		if (window{t, t + span}).count(oks) >= want {
			return t - end
		}
	}
	if len(oks) == 0 || oks[len(oks)-1] < end {
		return 0
	}
	return oks[len(oks)-1] - end
}

// TestFakeAPIWindows checks the windowed figures on hand-made timelines.
func TestFakeAPIWindows(t *testing.T) {
	ms := time.Millisecond
	every := func(from, to, step time.Duration) (ts []time.Duration) {
		for t := from; t < to; t += step {
			ts = append(ts, t)
		}
		return ts
	}
	a := &fakeAPI{throttle: window{from: 1000 * ms, to: 3000 * ms}}
	a.arrivals = every(0, 5000*ms, 10*ms)
	if n := a.requestsIn(a.throttle); n != 200 {
		t.Errorf("requestsIn = %d, want 200", n)
	}
	// Successes at 100 qps, except none in the window and a slow restart:
	// 20 qps for 400 ms after it, then 100 qps again.
	a.oks = slices.Concat(every(0, 1000*ms, 10*ms), every(3000*ms, 3400*ms, 50*ms), every(3400*ms, 5000*ms, 10*ms))
	if got := a.recovery(100, 500*ms); got < 300*ms || got > 400*ms {
		t.Errorf("recovery = %v, want 300ms..400ms", got)
	}
	// Full rate at once.
	a.oks = every(3000*ms, 5000*ms, 10*ms)
	if got := a.recovery(100, 500*ms); got != 0 {
		t.Errorf("recovery = %v, want 0", got)
	}
	// The backlog runs out before the rate recovers.
	a.oks = every(3000*ms, 3400*ms, 50*ms)
	if got := a.recovery(100, 500*ms); got != 350*ms {
		t.Errorf("recovery = %v, want 350ms (the last success)", got)
	}
}
