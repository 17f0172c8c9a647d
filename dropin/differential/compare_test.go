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

	allExcusals = secondOnFinish | silentReplace
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
	return out
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
