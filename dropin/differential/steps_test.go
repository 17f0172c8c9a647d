package differential

import (
	"fmt"
	"strings"
)

type stepKind int

const (
	stepRun stepKind = iota
	stepAdd
	stepSync
	stepHold
	stepRelease
	stepClose
)

// Pods as a script's calls are made from them, or SyncObject is given
// them.
var (
	none   = podState{}
	unsch  = podState{cond: unschedulable}
	schErr = podState{cond: schedulerError}
	a1     = podState{label: "1"}
)

// step is one step of a script.
type step struct {
	kind stepKind
	pod  int
	call callSpec // stepAdd
	obj  podState // stepSync: the pod as SyncObject is given it
	// notPod, for stepSync: SyncObject is given a node with the pod's UID
	// instead, which upstream's status patch (and a labelCall) refuses to
	// sync.
	notPod bool
	answer answer // stepRelease: how the held request is answered
}

// answer is how a released request is answered: with success, or with
// an error neither dispatcher retries (the drop-in retries a 429, a 5xx
// and a broken connection, by design), or with a 500 that the call's own
// Execute retries.
type answer int

const (
	answerOK answer = iota
	answer403
	// answer404: the pod is gone.
	answer404
	// answer409: a conflict, which upstream's status patch retries inside
	// its Execute (util.PatchPodStatus), its binding and a labelCall do not.
	answer409
	// answerPlain: an error that is no API status.
	answerPlain
	// answer500: an internal error, which upstream's status patch and
	// binding retry inside their Execute (util.Retriable), and the
	// drop-in retries too when an Execute returns it: only for those.
	answer500
)

// err is the error each answer gives (nil: the fake clientset answers).
func (a answer) err() error {
	return [...]error{nil, forbidden, notFound, conflict, errRefused, internal}[a]
}

func (a answer) String() string {
	return [...]string{"", " with a 403", " with a 404", " with a 409", " with a plain error", " with a 500"}[a]
}

func run() step                         { return step{kind: stepRun} }
func add(c callSpec) step               { return step{kind: stepAdd, pod: c.pod, call: c} }
func syncObject(p int, s podState) step { return step{kind: stepSync, pod: p, obj: s} }
func hold(p int) step                   { return step{kind: stepHold, pod: p} }
func release(p int) step                { return step{kind: stepRelease, pod: p} }
func releaseForbidden(p int) step       { return step{kind: stepRelease, pod: p, answer: answer403} }
func releaseWith(p int, a answer) step  { return step{kind: stepRelease, pod: p, answer: a} }
func syncNode(p int) step               { return step{kind: stepSync, pod: p, notPod: true} }
func closeDispatcher() step             { return step{kind: stepClose} }
func bind(p int, node string) callSpec {
	return callSpec{kind: binding, pod: p, node: node}
}

func patch(p int, from podState, c cond) callSpec {
	return callSpec{kind: statusPatch, pod: p, from: from, cond: c}
}

// nominating is patch, nominating node.
func nominating(p int, from podState, c cond, node string) callSpec {
	return callSpec{kind: statusPatch, pod: p, from: from, cond: c, nominate: node}
}

func label(p int, from podState, v string) callSpec {
	return callSpec{kind: setLabel, pod: p, from: from, value: v}
}

// labelOf is label, of kind k.
func labelOf(k labelKind, p int, from podState, v string) callSpec {
	return callSpec{kind: setLabel, pod: p, from: from, value: v, label: k}
}

func (s step) String() string {
	switch s.kind {
	case stepRun:
		return "Run"
	case stepAdd:
		return "Add " + s.call.String()
	case stepSync:
		if s.notPod {
			return fmt.Sprintf("SyncObject a node with %s's UID", podName(s.pod))
		}
		return fmt.Sprintf("SyncObject %s %s", podName(s.pod), s.obj)
	case stepHold:
		return "hold the next request for " + podName(s.pod)
	case stepClose:
		return "Close"
	default:
		return fmt.Sprintf("release %s's held request%s", podName(s.pod), s.answer)
	}
}

type script []step

func (sc script) String() string {
	var b strings.Builder
	for i, s := range sc {
		fmt.Fprintf(&b, "%3d  %s\n", i, s)
	}
	return b.String()
}
