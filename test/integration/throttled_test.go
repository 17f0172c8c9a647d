package integration

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// testThrottled is scenario 5, against an apiserver started with
// --max-mutating-requests-inflight=2 and API Priority and Fairness off, so
// that a write beyond two at once is answered 429 with Retry-After: 1.
// Each subtest sends a burst of 40 status patches, one per pod, through a
// dispatcher of 8 workers (6 of which status patches may hold; the preset
// keeps 2 for bindings) with no client-side rate limit, so that the server
// is the only limit, and the default retry policy — 3 attempts, and a
// budget of max(BudgetMin, 20% of first attempts) retries per 10s window,
// BudgetMin 10 — but for the adaptive subtest's BudgetMin, below. Each
// subtest runs within one window.
//
// Both subtests prove: each retry of a throttled call reached the server
// no sooner than the Retry-After the server sent with its 429, counted
// from that 429's answer; the dispatcher made every request itself
// (requests at the server = its executions: client-go's own retries are
// off); retries stayed within the budget; every call ended within
// callTimeout.
//
// With fixed workers, the burst overruns the server again and again: most
// first attempts are refused, and the budget stops the retry storm — the
// calls it refuses a retry end Failed at once instead of hammering the
// server. With Config.Adaptive, the first 429 holds every new execution for
// the Retry-After and halves the concurrency: the server refuses far fewer
// requests, the retries fit the budget, and once the burst has drained to
// what the server admits every call succeeds. Its budget is raised from
// the default 10 to 20: each of its probes above the server's limit costs
// a 429, and with 40 calls the runs here made 4 to 7 retries in all —
// near enough to 10 that the default would make the test a matter of luck.
func testThrottled(t *testing.T, s *apiserver.Server) {
	const (
		workers = 8
		calls   = 40
	)
	options := func(a *dispatch.AdaptivePolicy, budgetMin int) kube.Options {
		return kube.Options{
			QPS:     -1,
			Workers: workers,
			Start:   dispatch.StartPolicy{Adaptive: a},
			Retry:   dispatch.RetryPolicy{BudgetMin: budgetMin},
		}
	}

	var fixed throttleResult
	t.Run("fixed workers: the budget caps retries", func(t *testing.T) {
		fixed = throttleRun(t, s, "fixed", calls, options(nil, 10 /* the default */))
		assert.Positive(t, fixed.budgetRefused, "no call was refused a retry by the budget: the storm did not reach it")
		assert.Equal(t, calls, fixed.succeeded+fixed.budgetRefused+fixed.failures["attempts"],
			"calls end Succeeded, or Failed for the budget or their attempts")
		fixed.log(t, "scenario 5, fixed workers")
	})

	t.Run("adaptive: every call succeeds, fewer 429s", func(t *testing.T) {
		r := throttleRun(t, s, "adaptive", calls, options(&dispatch.AdaptivePolicy{}, 20 /* twice the default */))
		assert.Equal(t, r.n, r.succeeded, "calls succeeded: %v", r.failures)
		assert.Equal(t, r.throttled, int(r.stats.Retries), "every 429 retried once, and nothing else")
		if fixed.n > 0 {
			assert.Less(t, r.throttled, fixed.throttled, "429s with an adaptive limit, against fixed workers")
		}
		r.log(t, "scenario 5, adaptive")
	})
}

// throttleResult is what one throttled run observed.
type throttleResult struct {
	n, succeeded  int
	throttled     int            // requests answered 429
	budget        int            // retries the policy allows
	budgetRefused int            // calls that failed because the budget refused their retry
	failures      map[string]int // failed calls by reason
	minGap        time.Duration  // shortest time from a 429's answer to the call's next request
	took          time.Duration
	stats         dispatch.Stats
}

func (r throttleResult) log(t *testing.T, what string) {
	t.Helper()
	t.Logf("%s: %d status patches: %d succeeded, failed %v; %d answered 429, %d retries (budget %d), next request ≥ %v after a 429; %v",
		what, r.n, r.succeeded, r.failures, r.throttled, r.stats.Retries, r.budget,
		r.minGap.Round(time.Millisecond), r.took.Round(10*time.Millisecond))
}

// retryBudget is how many retries the retry policy p (with the default
// BudgetRatio) allows n first attempts in one window.
func retryBudget(p dispatch.RetryPolicy, n int) int {
	return max(p.BudgetMin, int(0.2*float64(n))) // 0.2: the default BudgetRatio
}

// throttleRun submits a status patch for each of n new pods at once
// through a dispatcher configured by o, waits for every outcome, and checks
// what every throttled run must show.
func throttleRun(t *testing.T, s *apiserver.Server, prefix string, n int, o kube.Options) throttleResult {
	t.Helper()
	ns := createNamespace(t, s.AdminClient, prefix)
	pods := createPods(t, s.AdminClient, ns, prefix, n)
	d := newDispatcher(t, s.Config, o)

	r := throttleResult{n: n, failures: map[string]int{}}
	start := time.Now()
	tickets := make([]*kube.Ticket, n)
	for i, p := range pods {
		var err error
		tickets[i], err = d.Submit(t.Context(), kube.PatchStatus(p, kube.StatusPatch{Conditions: []corev1.PodCondition{unschedulable("throttled")}}), kube.SubmitOptions{})
		require.NoError(t, err)
	}
	for i, tk := range tickets {
		res := wait(t, tk)
		var re *dispatch.RetryError
		switch {
		case res.State == dispatch.StateSucceeded:
			r.succeeded++
		case errors.As(res.Err, &re):
			r.failures[string(re.Reason)]++
			if re.Reason == "budget" {
				r.budgetRefused++
			}
		default:
			r.failures[res.State.String()]++
			t.Errorf("pod %s: %v: %v", pods[i].Name, res.State, res.Err)
		}
	}
	r.took = time.Since(start)
	r.stats = d.Stats()

	reqs := s.Proxy.Filter(inNamespace(ns))
	byPod := map[string][]apiserver.Request{}
	for _, q := range reqs {
		require.True(t, isStatusPatch(q), "unexpected request %v", q)
		byPod[q.Name] = append(byPod[q.Name], q)
		if q.Status == http.StatusTooManyRequests {
			r.throttled++
		}
	}
	require.Positive(t, r.throttled, "the server answered no 429: the scenario tested nothing")
	assert.Equal(t, int(r.stats.Executions), len(reqs), "requests at the server, against the dispatcher's executions")
	r.budget = retryBudget(o.Retry, n)
	assert.LessOrEqual(t, int(r.stats.Retries), r.budget, "retries beyond the budget")

	r.minGap = time.Hour
	for name, qs := range byPod {
		for k, q := range qs {
			switch q.Status {
			case http.StatusOK:
				assert.Equal(t, len(qs)-1, k, "pod %s: written, then written again", name)
			case http.StatusTooManyRequests:
				assert.Equal(t, time.Second, q.RetryAfter, "pod %s: the 429's Retry-After", name)
				if k+1 < len(qs) {
					gap := qs[k+1].Received.Sub(q.Answered)
					r.minGap = min(r.minGap, gap)
					assert.GreaterOrEqual(t, gap, q.RetryAfter, "pod %s: retry %v after its 429, which asked for %v", name, gap, q.RetryAfter)
				}
			default:
				t.Errorf("pod %s: status write answered %d", name, q.Status)
			}
		}
	}

	// What succeeded is on the server.
	list, err := s.AdminClient.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	require.NoError(t, err)
	written := 0
	for i := range list.Items {
		if c := condition(&list.Items[i], corev1.PodScheduled); c != nil && c.Message == "throttled" {
			written++
		}
	}
	assert.Equal(t, r.succeeded, written, "pods with the patch at the server")
	if t.Failed() {
		for _, q := range reqs {
			t.Logf("%v +%v..+%v", q, q.Received.Sub(start), q.Answered.Sub(start))
		}
	}
	return r
}
