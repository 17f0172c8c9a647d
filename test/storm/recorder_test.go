package storm

import (
	"context"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// recorder keeps what the test's pod informer saw of each pod, in the
// order the server committed it (one watch carries every pod of the
// namespace, in resourceVersion order), with the time each event arrived,
// and when the run's clock started (see start).
type recorder struct {
	mu     sync.Mutex
	t0     time.Time
	seq    int // events observed so far
	pods   map[string]*podRecord
	want   Workload
	bound  int // schedulable pods seen with spec.nodeName
	failed int // unschedulable pods seen with PodScheduled=False
	// firstFailure is closed once an unschedulable pod has been seen
	// with its condition, complete once every schedulable pod has been
	// seen bound and every unschedulable one with its condition.
	firstFailure, complete chan struct{}
}

// podRecord is what the informer saw of one pod; seqs count the events
// observed before.
type podRecord struct {
	schedulable bool
	victim      bool      // in the preempt shape: a low-priority pod a preemptor may evict
	created     time.Time // first seen
	createdSeq  int
	bound       time.Time // first seen with spec.nodeName, if boundSeq > 0
	boundSeq    int
	node        string
	failed      time.Time // first seen with PodScheduled=False, if failedSeq > 0
	failedSeq   int
	// rebound counts the times spec.nodeName was seen to change once
	// set: a pod bound twice.
	rebound int
	// nominated is when the pod was first seen with
	// status.nominatedNodeName (preemption's nomination), if nominatedSeq
	// > 0; deleted when the informer saw it go, if not zero.
	nominated    time.Time
	nominatedSeq int
	deleted      time.Time
}

func newRecorder(w Workload) *recorder {
	return &recorder{
		t0:           time.Now(),
		pods:         make(map[string]*podRecord, w.Unschedulable+w.Schedulable),
		want:         w,
		firstFailure: make(chan struct{}),
		complete:     make(chan struct{}),
	}
}

// start starts the run's clock.
func (r *recorder) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t0 = time.Now()
}

// observe records a pod as an informer event delivered it.
func (r *recorder) observe(p *corev1.Pod) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	at := now
	rec, ok := r.pods[p.Name]
	if !ok {
		rec = &podRecord{
			schedulable: strings.HasPrefix(p.Name, podPrefix),
			victim:      strings.HasPrefix(p.Name, victimPrefix),
			created:     at, createdSeq: r.seq,
		}
		r.pods[p.Name] = rec
	}
	if rec.nominatedSeq == 0 && p.Status.NominatedNodeName != "" {
		rec.nominated, rec.nominatedSeq = at, r.seq
	}
	if n := p.Spec.NodeName; n != "" {
		switch {
		case rec.boundSeq == 0:
			rec.bound, rec.boundSeq, rec.node = at, r.seq, n
			if rec.schedulable {
				r.bound++
			}
		case rec.node != n:
			rec.rebound++
			rec.node = n
		}
	}
	if rec.failedSeq == 0 && unschedulable(p) {
		rec.failed, rec.failedSeq = at, r.seq
		if !rec.schedulable {
			if r.failed == 0 {
				close(r.firstFailure)
			}
			r.failed++
		}
	}
	if r.bound == r.want.Schedulable && r.failed == r.want.Unschedulable {
		select {
		case <-r.complete:
		default:
			close(r.complete)
		}
	}
}

// gone records that the informer saw p deleted.
func (r *recorder) gone(p *corev1.Pod) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	if rec, ok := r.pods[p.Name]; ok && rec.deleted.IsZero() {
		rec.deleted = now
	}
}

// stalled returns a channel closed once quiet has passed both since every
// unschedulable pod was seen with its condition and since a schedulable
// pod was last seen bound, or never if ctx ends first. It polls the
// recorder every 100 ms.
func (r *recorder) stalled(ctx context.Context, quiet time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		last, drained, since := -1, false, time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			bound, failed := r.progress()
			if bound != last || (!drained && failed == r.want.Unschedulable) {
				last, drained, since = bound, failed == r.want.Unschedulable, time.Now()
			}
			if drained && time.Since(since) >= quiet {
				close(ch)
				return
			}
		}
	}()
	return ch
}

// progress returns how many schedulable pods were seen bound and how many
// unschedulable ones with their condition.
func (r *recorder) progress() (bound, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bound, r.failed
}

// snapshot returns a copy of the records by pod name.
func (r *recorder) snapshot() map[string]podRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]podRecord, len(r.pods))
	for name, rec := range r.pods {
		out[name] = *rec
	}
	return out
}

// startTime is when the run's clock started.
func (r *recorder) startTime() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.t0
}

// unschedulable tells whether p carries PodScheduled=False with reason
// Unschedulable: the scheduler's failure status patch landed.
func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}
