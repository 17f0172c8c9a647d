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
	fail bool     // stepRelease: answer the held request with a 403
}

func run() step                         { return step{kind: stepRun} }
func add(c callSpec) step               { return step{kind: stepAdd, pod: c.pod, call: c} }
func syncObject(p int, s podState) step { return step{kind: stepSync, pod: p, obj: s} }
func hold(p int) step                   { return step{kind: stepHold, pod: p} }
func release(p int) step                { return step{kind: stepRelease, pod: p} }
func releaseForbidden(p int) step       { return step{kind: stepRelease, pod: p, fail: true} }
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

func (s step) String() string {
	switch s.kind {
	case stepRun:
		return "Run"
	case stepAdd:
		return "Add " + s.call.String()
	case stepSync:
		return fmt.Sprintf("SyncObject %s %s", podName(s.pod), s.obj)
	case stepHold:
		return "hold the next request for " + podName(s.pod)
	case stepClose:
		return "Close"
	default:
		if s.fail {
			return fmt.Sprintf("release %s's held request with a 403", podName(s.pod))
		}
		return fmt.Sprintf("release %s's held request", podName(s.pod))
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
