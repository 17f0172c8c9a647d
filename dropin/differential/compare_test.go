package differential

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// excusal is a difference between the dispatchers that a comparison
// excuses: trace removes it from upstream's events, so that the traces
// compare.
type excusal int

const (
	// secondOnFinish is by design (kube/scheduler README, "OnFinish"):
	// upstream sends ErrCallOverwritten to a call in flight that a call of
	// the same type merges with, and later that call's execution result;
	// the drop-in sends only the result. Upstream sends two values only
	// then (a pending call it overwrites never runs), so the first of two
	// values, if it is ErrCallOverwritten, is dropped.
	secondOnFinish excusal = 1 << iota
	// silentReplace is upstream's, not the drop-in's: call_queue.go's
	// merge asks whether the OBJECT has a call in flight, not whether the
	// call it replaces is that call. So a pending call that a call of
	// another type replaces, while the object's call is in flight, is
	// dropped without a value on its OnFinish, ever; the drop-in tells it
	// ErrCallOverwritten. (TestKnownDifferences shows it.) Such a
	// call is the only one upstream never answers; it is replaced by the
	// next Add for its object that upstream accepts, so upstream's trace
	// gets the drop-in's ErrCallOverwritten at that step.
	silentReplace
	// closeEnds is by design (kube/scheduler README, "Bounds and ends"):
	// the drop-in's Close ends the calls it finds queued with
	// dispatch.ErrClosed, where upstream's leaves them without an answer,
	// and the context it cancels for a call in flight has
	// dispatch.ErrClosed as its cause, where upstream's has
	// context.Canceled (so the fake server's held request, which returns
	// the cause, fails with it, and so does the call — but for a status
	// patch or a binding cancelled as it retried a 409 or a 500 inside its
	// Execute: client-go's retry.OnError takes context.Canceled for an
	// interruption and returns the error before it, upstream's 409 or
	// 500, where the drop-in's call fails with its cause). After Close the
	// drop-in's SyncObject finds no call, and returns the object as given;
	// upstream's syncs the calls its Close left queued. So from the Close
	// step on, upstream's "context canceled" is the drop-in's "dispatch:
	// closed", a call upstream never answers is told ErrClosed at the
	// Close step, and a SyncObject returns what it was given. (The random
	// scripts close only where upstream's outcome is settled: never with
	// a call queued behind its object's call in flight, which upstream's
	// Close races to start or leave; see randomScript.)
	closeEnds

	allExcusals = secondOnFinish | silentReplace | closeEnds
)

func (ex excusal) apply(evs []event) []event {
	byCall := map[int][]int{}
	for k, e := range evs {
		if e.call >= 0 {
			byCall[e.call] = append(byCall[e.call], k)
		}
	}
	var out []event
	if ex&silentReplace != 0 {
		for _, e := range evs {
			if e.added == "" || byCall[e.step] != nil {
				continue
			}
			for _, r := range evs {
				if r.added == "ok" && r.pod == e.pod && r.step > e.step {
					out = append(out, event{step: r.step, order: 2, key: e.step, text: fmt.Sprintf("#%d finished: overwritten", e.step), call: e.step, outcome: "overwritten"})
					break
				}
			}
		}
	}
	for k, e := range evs {
		if ks := byCall[e.call]; ex&secondOnFinish != 0 && len(ks) == 2 && ks[0] == k && e.outcome == "overwritten" {
			continue
		}
		out = append(out, e)
	}
	if ex&closeEnds != 0 {
		out = closeEnded(out)
	}
	return out
}

// closeEnded applies closeEnds to evs.
func closeEnded(evs []event) []event {
	at := slices.IndexFunc(evs, func(e event) bool { return e.closed })
	if at < 0 {
		return evs
	}
	c := evs[at].step
	const canceled, closed = "error: context canceled", "error: dispatch: closed"
	told := map[int]bool{}
	podOf := map[int]int{} // a call's pod, by its Add's step
	cut := map[int]bool{}  // the pods whose request Close cancelled
	for _, e := range evs {
		if e.added != "" {
			podOf[e.step] = e.pod
		}
		if e.order == 1 && strings.Contains(e.text, canceled) {
			cut[e.pod] = true
		}
	}
	for k, e := range evs {
		if e.call >= 0 {
			told[e.call] = true
		}
		// Only Close cancels upstream's context: a request held since an
		// earlier step was answered by it too.
		e.text = strings.ReplaceAll(e.text, canceled, closed)
		if e.outcome == canceled {
			e.outcome = closed
		}
		// A call whose Execute retries (util.PatchPodStatus, BindPod:
		// retry.OnError) and whose retry Close cancelled: upstream's
		// returns the error of the attempt before, for retry.OnError
		// takes context.Canceled for an interruption, and the drop-in's
		// cause for an error.
		if e.call >= 0 && e.step == c && cut[podOf[e.call]] && (e.outcome == "409" || e.outcome == "500") {
			e.outcome = closed
			e.text = fmt.Sprintf("#%d finished: %s", e.call, closed)
		}
		if e.given != "" && e.step > c {
			e.text = fmt.Sprintf("SyncObject %s: %s, ok", podName(e.pod), e.given)
		}
		evs[k] = e
	}
	for _, e := range slices.Clone(evs) {
		if e.added == "ok" && e.step < c && !told[e.step] {
			evs = append(evs, event{step: c, order: 2, key: e.step, text: fmt.Sprintf("#%d finished: error: dispatch: closed", e.step), call: e.step, outcome: "error: dispatch: closed"})
		}
	}
	return evs
}

// diff renders two traces line by line (a longest-common-subsequence
// diff): "-" upstream only, "+" drop-in only.
func diff(a, b []string) string {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			fmt.Fprintf(&out, "    %s\n", a[i])
			i, j = i+1, j+1
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			fmt.Fprintf(&out, "  - %s\n", a[i])
			i++
		default:
			fmt.Fprintf(&out, "  + %s\n", b[j])
			j++
		}
	}
	return out.String()
}

// compare fails t if the traces differ, showing the script and the diff.
func compare(t *testing.T, sc script, theirs, ours []string, about string) bool {
	t.Helper()
	if slices.Equal(theirs, ours) {
		return true
	}
	t.Errorf("%sthe drop-in differs from upstream.\nscript:\n%s\ntrace (-upstream +drop-in):\n%s", about, sc, diff(theirs, ours))
	return false
}
