package differential

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	upstream "k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher"

	dropin "github.com/coalescer/dispatch/dropin/apidispatcher"
)

// dispatcher is the API both packages export.
type dispatcher interface {
	Add(fwk.APICall, fwk.APICallOptions) error
	SyncObject(metav1.Object) (metav1.Object, error)
	Run(klog.Logger)
	Close()
}

var (
	_ dispatcher = (*upstream.APIDispatcher)(nil)
	_ dispatcher = (*dropin.APIDispatcher)(nil)
)

// parallelization is what both dispatchers are given: kube-scheduler's
// default parallelism.
const parallelization = 16

func newUpstream(c clientset.Interface) dispatcher {
	return upstream.New(c, parallelization, relevances)
}

func newDropIn(c clientset.Interface) dispatcher {
	return dropin.New(c, parallelization, relevances)
}

// side is one dispatcher, its server, and what it was seen to do.
type side struct {
	d      dispatcher
	srv    *server
	pods   int
	ran    bool
	closed bool               // by a Close step
	finish map[int]chan error // by the Add's step
	events []event

	mu     sync.Mutex
	merges []event // what the labelCalls' Merge were told, as they were
	execs  executions
}

// event is one observation, at a step: the step's own result, a request
// at the server, a call's OnFinish value, or (at the end) a pod as the
// server has it.
type event struct {
	step  int
	order int // 0: the step's own; 1: a request; 2: an OnFinish value; 3: a pod at the end
	key   int // the order among events of one step and kind
	text  string

	call    int    // an OnFinish value's call (its Add's step); -1 for other events
	outcome string // an OnFinish value's class

	added string // an Add's result; "" for other events
	pod   int    // an Add's, a SyncObject's or a request's pod

	closed bool   // the Close step's own event
	given  string // a SyncObject's: the object it was given, as described
}

func newSide(pods int, newDispatcher func(clientset.Interface) dispatcher) *side {
	var ps []*v1.Pod
	for i := range pods {
		ps = append(ps, pod(i, none))
	}
	srv := newServer(ps...)
	return &side{d: newDispatcher(srv.client()), srv: srv, pods: pods, finish: map[int]chan error{}}
}

// merged records a labelCall's Merge, at the step under way.
func (s *side) merged(text string) {
	step := s.srv.currentStep()
	s.mu.Lock()
	s.merges = append(s.merges, event{step: step, key: 1 + len(s.merges), text: text, call: -1})
	s.mu.Unlock()
}

func (s *side) note(i, order, key int, format string, args ...any) {
	s.events = append(s.events, event{step: i, order: order, key: key, text: fmt.Sprintf(format, args...), call: -1})
}

// apply runs step i.
func (s *side) apply(t *testing.T, i int, st step) {
	s.srv.setStep(i)
	switch st.kind {
	case stepRun:
		if !s.ran {
			s.ran = true
			// Errors only: the calls log every execution at V(3).
			s.d.Run(ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1))))
		}
	case stepAdd:
		// Room for upstream's two values to a call in flight that a call
		// of its type merges with (see secondOnFinish).
		ch := make(chan error, 4)
		s.finish[i] = ch
		c := class(s.d.Add(st.call.build(i, s.merged), fwk.APICallOptions{OnFinish: ch}))
		s.events = append(s.events, event{step: i, text: fmt.Sprintf("Add #%d: %s", i, c), call: -1, added: c, pod: st.pod})
	case stepSync:
		var given metav1.Object = pod(st.pod, st.obj)
		if st.notPod {
			given = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: podName(st.pod), UID: given.GetUID()}}
		}
		obj, err := s.d.SyncObject(given)
		s.note(i, 0, 0, "SyncObject %s: %s, %s", podName(st.pod), describePod(obj), class(err))
		e := &s.events[len(s.events)-1]
		e.pod, e.given = st.pod, describePod(given)
	case stepHold:
		s.srv.hold(podName(st.pod))
	case stepClose:
		s.d.Close()
		s.closed = true
		s.events = append(s.events, event{step: i, text: "Close", call: -1, closed: true})
	case stepRelease:
		if _, ok := s.srv.release(podName(st.pod), st.answer.err()); !ok {
			s.note(i, 0, 0, "release %s: nothing held", podName(st.pod))
		}
		if st.answer == answer409 || st.answer == answer500 {
			// Upstream's status patch retries a 409 or a 500 inside its
			// Execute, its binding a 500, asleep (retry.DefaultBackoff:
			// 10, 50, 250 ms, ±10 %): the bubble's clock moves on until
			// it has, within the step.
			synctest.Wait()
			time.Sleep(time.Second)
		}
	}
}

// collect takes the OnFinish values that arrived, and the executions
// kube-scheduler's metrics recorded, as of step i.
func (s *side) collect(i int) {
	for k, text := range s.execs.since() {
		s.note(i, 2, 1<<30+k, "%s", text)
	}
	for _, id := range slices.Sorted(maps.Keys(s.finish)) {
		for more := true; more; {
			select {
			case err := <-s.finish[id]:
				c := class(err)
				s.events = append(s.events, event{step: i, order: 2, key: id, text: fmt.Sprintf("#%d finished: %s", id, c), call: id, outcome: c})
			default:
				more = false
			}
		}
	}
}

// finalState records the pods as the server has them, at step i.
func (s *side) finalState(i int) {
	for p := range s.pods {
		got, err := s.srv.pod(podName(p))
		if err != nil {
			s.note(i, 3, p, "server: %s: %v", podName(p), err)
			continue
		}
		s.note(i, 3, p, "server: %s %s", podName(p), describePod(got))
	}
}

// trace renders what the side was seen to do, in a canonical order: by
// step; within a step, its own result, then the requests that arrived
// (by pod, in order of arrival), then the OnFinish values (by call), then
// at the end the pods. A request that was held shows the step at which it
// was answered. ex is what is excused (upstream's side only).
func (s *side) trace(ex excusal) []string {
	evs := slices.Concat(s.events, s.merges)
	for k, r := range s.srv.requests() {
		text := fmt.Sprintf("%s: %s → %s", r.pod, r.what, cmp.Or(r.result, "still held"))
		if r.held {
			text += fmt.Sprintf(" (held, answered at %d)", r.at)
		}
		var p int
		fmt.Sscanf(r.pod, "p%d", &p)
		evs = append(evs, event{step: r.step, order: 1, key: p<<20 + k, text: text, call: -1, pod: p})
	}
	evs = ex.apply(evs)
	slices.SortStableFunc(evs, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.step, b.step), cmp.Compare(a.order, b.order), cmp.Compare(a.key, b.key))
	})
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%d  %s", e.step, e.text))
	}
	return out
}

// play runs a script through both dispatchers, step by step, in one
// synctest bubble: after each step, synctest.Wait lets every goroutine run
// until it blocks (at a held request, or idle), so what a step leads to is
// settled before the next step, the same on every run. next returns step
// i, or false at the end; it may look at upstream's side (at what it
// holds). At the end a dispatcher not yet Run is Run, unless a Close step
// closed it (upstream's would run what its Close left queued); the holds
// are disarmed and every held request is answered with success; once all
// has settled, the pods are read from the server and the dispatchers
// closed. It returns the script played and both traces, upstream's with ex
// excused.
func play(t *testing.T, pods int, ex excusal, next func(i int, up *side) (step, bool)) (sc script, theirs, ours []string) {
	synctest.Test(t, func(t *testing.T) {
		up, di := newSide(pods, newUpstream), newSide(pods, newDropIn)
		sides := []*side{up, di}
		i := 0
		for ; ; i++ {
			st, ok := next(i, up)
			if !ok {
				break
			}
			sc = append(sc, st)
			for _, s := range sides {
				s.execs.mark()
				s.apply(t, i, st)
				synctest.Wait() // one side's work never overlaps the other's
				s.collect(i)
			}
		}
		for _, s := range sides {
			s.execs.mark()
			if !s.ran && !s.closed { // upstream's Run after Close runs what its Close left queued
				s.apply(t, i, run())
			}
			s.srv.setStep(i)
			s.srv.disarm()
			for _, p := range s.srv.heldPods() {
				s.srv.release(p, nil)
			}
			synctest.Wait()
			s.collect(i)
			s.finalState(i)
			s.d.Close()
			synctest.Wait()
			// Nothing is queued any more: a value now (the drop-in's
			// ErrClosed) is a call that was stuck.
			s.collect(i)
		}
		theirs, ours = up.trace(ex), di.trace(0)
	})
	return sc, theirs, ours
}

// playScript plays a fixed script.
func playScript(t *testing.T, pods int, ex excusal, sc script) (theirs, ours []string) {
	_, theirs, ours = play(t, pods, ex, func(i int, _ *side) (step, bool) {
		if i < len(sc) {
			return sc[i], true
		}
		return step{}, false
	})
	return theirs, ours
}
