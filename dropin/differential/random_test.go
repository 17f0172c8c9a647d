package differential

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	randomN     = flag.Int("differential.n", 100, "random scripts to run (TestRandomScripts)")
	randomSeed  = flag.Uint64("differential.seed", 1, "seed of the first random script; script k uses seed+k (0: from the clock)")
	randomSteps = flag.Int("differential.steps", 30, "steps of each random script")
	randomFails = flag.Int("differential.failures", 1, "differing random scripts to report before stopping")
)

// The pods of a random script.
const randomPods = 3

// maxBusy bounds the pods with a hold armed or a request held at once. By
// design (kube/scheduler README, "In kube-scheduler: the drop-in"), the
// drop-in may hold status patches back: it paces them (with a client it
// can unwrap, one in flight until one has ended; this server's fake
// clientset is not such a client), and a patch held back waits in the
// queue, pending, where upstream's runs; an object's pending call and its
// call in flight follow different rules. With at most one held, a patch
// always finds a free place.
const maxBusy = 1

// randomScript returns a generator of one random script: a few pods, and
// steps whose outcome is the same on every run in both dispatchers (play
// settles after each). Status patches set PodScheduled and sometimes
// nominate a node (which PodStatusPatchCall.Merge carries from an older
// call to a newer one); label calls set label a, half of them of a kind
// that tries the rules' corners: a call whose Merge fails, one of a type
// the relevance table does not name, one that says it is a status patch,
// one more relevant than a binding (labelKind). SyncObject is sometimes given a node, which a status patch's
// and a label call's Sync refuse. A held request is answered with success,
// or with an error neither dispatcher retries (answer). What the drop-in
// does differently by design (kube/scheduler README) is excluded:
//
//   - "OnFinish": upstream's second value to a call in flight that a call
//     of its type merges with is excused (secondOnFinish), as is the
//     value upstream never sends to a call it replaces silently
//     (silentReplace, upstream's bug; TestKnownDifferences shows it).
//   - "Retries": requests are never answered with a 429, a 5xx or a
//     broken connection, which the drop-in retries, but for a 500 that
//     the Execute of upstream's status patch or binding retries itself,
//     and never returns (mayAnswer500).
//   - "Bounds and ends": a quarter of the scripts Close, where upstream's
//     outcome is settled (closable), and then only call SyncObject; what
//     the drop-in's Close tells and what its SyncObject then returns are
//     excused (closeEnds). No Add follows Close, and no Run (upstream's
//     runs what its Close left queued). Time moves only for upstream's
//     status patch to sleep out a 409's backoff, a second at such a
//     release, so no call nears its deadline; the queue's bound is far.
//   - The cap on status patches in flight: maxBusy.
//
// Priority and the order across objects are not compared (play orders
// requests by pod): the rules are per object.
func randomScript(r *rand.Rand, steps int) func(i int, up *side) (step, bool) {
	ran, closed := false, false
	// A quarter of the scripts Close from a step in their second half on,
	// the first where upstream's outcome is settled (closable); then they
	// only call SyncObject.
	closeAt := steps
	if r.IntN(4) == 0 {
		closeAt = steps/2 + r.IntN(steps-steps/2)
	}
	state := func() podState {
		return podState{cond: cond(r.IntN(3)), nominated: []string{"", "", "node-1"}[r.IntN(3)], label: []string{"", "1", "2"}[r.IntN(3)]}
	}
	return func(i int, up *side) (step, bool) {
		if i >= steps {
			return step{}, false
		}
		if !ran && !closed && (i >= 4 || r.IntN(4) == 0) {
			ran = true
			return run(), true
		}
		p := r.IntN(randomPods)
		if !closed && i >= closeAt && closable(up) {
			closed = true
			return closeDispatcher(), true
		}
		if closed {
			if r.IntN(8) == 0 {
				return syncNode(p), true
			}
			return syncObject(p, state()), true
		}
		for {
			switch k := r.IntN(100); {
			case k < 30:
				return add(nominating(p, state(), cond(1+r.IntN(2)), []string{"", "", "", "node-1", "node-2"}[r.IntN(5)])), true
			case k < 38:
				return add(bind(p, fmt.Sprint("node-", 1+r.IntN(2)))), true
			case k < 53:
				kind := plainLabel
				if r.IntN(2) == 0 {
					kind = labelKind(1 + r.IntN(4)) // strict, other-type, status-patch-typed, urgent
				}
				return add(labelOf(kind, p, state(), fmt.Sprint(1+r.IntN(2)))), true
			case k < 68:
				return syncObject(p, state()), true
			case k < 70:
				return syncNode(p), true
			case k < 80:
				busy := up.srv.busy()
				if len(busy) < maxBusy || slices.Equal(busy, []string{podName(p)}) {
					return hold(p), true
				}
			default:
				held := up.srv.heldPods()
				if len(held) == 0 {
					continue
				}
				var q int
				fmt.Sscanf(held[r.IntN(len(held))], "p%d", &q)
				if r.IntN(3) == 0 {
					n := 4 // 403, 404, 409, a plain error
					if mayAnswer500(up, podName(q)) {
						n++
					}
					return releaseWith(q, answer(1+r.IntN(n))), true
				}
				return release(q), true
			}
		}
	}
}

// mayAnswer500 reports whether pod's held request may be answered with a
// 500: it is a status patch's or a binding's, whose Execute retries it
// (util.Retriable) — the drop-in would retry it at the dispatcher too,
// by design, if Execute returned it — and the request before it for pod
// did not fail with what Execute retries (a 409 or a 500), so that a
// 500 is never the last of the four requests Execute makes at most.
func mayAnswer500(up *side, pod string) bool {
	var last, held string
	for _, r := range up.srv.requests() {
		if r.pod != pod {
			continue
		}
		if r.held && r.result == "" {
			held = r.what
			break
		}
		last = r.result
	}
	return (strings.HasPrefix(held, "patch status") || strings.HasPrefix(held, "bind")) && last != "409" && last != "500"
}

// closable reports whether upstream's Close would leave a settled
// outcome: no object has a call queued behind its call in flight (a
// request held at the server), which upstream's Close races to start,
// with the cancelled context, or leave (closeEnds). A call queued behind
// is an Add accepted after the call in flight began: at its first
// request, which the held one may follow after failures its Execute
// retries (taken to be, for any call, every 409 and 500 before it; too
// early a start only keeps Close off).
func closable(up *side) bool {
	reqs := up.srv.requests()
	for k, r := range reqs {
		if !r.held || r.result != "" {
			continue
		}
		began := r.step
		for j := k - 1; j >= 0; j-- {
			if reqs[j].pod != r.pod {
				continue
			}
			if reqs[j].result != "409" && reqs[j].result != "500" {
				break
			}
			began = reqs[j].step
		}
		for _, e := range up.events {
			if e.added == "ok" && podName(e.pod) == r.pod && e.step > began {
				return false
			}
		}
	}
	return true
}

// TestRandomScripts plays seeded random scripts through both dispatchers
// and compares. A script that differs is shrunk (steps removed while it
// still differs) and reported with its seed, which replays it:
// -differential.seed=SEED -differential.n=1.
func TestRandomScripts(t *testing.T) {
	seed := *randomSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seeds %d to %d (-differential.seed, -differential.n)", seed, seed+uint64(*randomN)-1)
	failures := 0
	seen := map[string]bool{}
	for k := range *randomN {
		s := seed + uint64(k)
		r := rand.New(rand.NewPCG(s, s))
		sc, theirs, ours := play(t, randomPods, allExcusals, randomScript(r, *randomSteps))
		if slices.Equal(theirs, ours) {
			continue
		}
		small := shrink(t, sc)
		theirs, ours = playScript(t, randomPods, allExcusals, small)
		key := small.String()
		if seen[key] {
			continue
		}
		seen[key] = true
		compare(t, small, theirs, ours, fmt.Sprintf("seed %d (-differential.seed=%d -differential.n=1; %d steps, shrunk to %d): ", s, s, len(sc), len(small)))
		if failures++; failures >= *randomFails {
			return
		}
	}
	if failures == 0 {
		t.Logf("%d scripts of %d steps: no difference", *randomN, *randomSteps)
	}
}

// shrink removes steps from sc, one at a time, while the result still
// differs, and returns the smallest it found. A script whose Close the
// removal moved where upstream's outcome is a race (closable) is not
// taken.
func shrink(t *testing.T, sc script) script {
	differs := func(sc script) bool {
		racy := false
		_, theirs, ours := play(t, randomPods, allExcusals, func(i int, up *side) (step, bool) {
			if i >= len(sc) || racy {
				return step{}, false
			}
			if sc[i].kind == stepClose && !closable(up) {
				racy = true
				return step{}, false
			}
			return sc[i], true
		})
		return !racy && !slices.Equal(theirs, ours)
	}
	for changed := true; changed; {
		changed = false
		for i := len(sc) - 1; i >= 0; i-- {
			if sc[i].kind == stepRun {
				continue
			}
			smaller := slices.Delete(slices.Clone(sc), i, i+1)
			if differs(smaller) {
				sc, changed = smaller, true
			}
		}
	}
	return sc
}
