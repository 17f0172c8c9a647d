package writer

import (
	"context"
	"errors"
	"fmt"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// exec is the dispatcher's ExecFunc: it writes p's status, then its
// object. The dispatcher took a token for the first request; every further
// one (a read for a baseline, the object's write after the status's) takes
// its own. The changes run here, under the execution's context, so that
// one that blocks holds its write only until the write's deadline, its
// cancellation (Forget) or Close. If no write of p was ever needed — every
// target already as the change would make it — p ends Skipped
// (dispatch.SkipCall).
func (w *Writer[O]) exec(ctx context.Context, _ types.UID, p *op[O]) error {
	ctx, n := withNote(ctx)
	first, sent := true, false
	for t := range numTargets {
		if p.desire.change(t) == nil || p.landed[t] {
			continue
		}
		wrote, err := w.write(ctx, n, t, p, &first)
		if err != nil {
			return err
		}
		sent = sent || wrote
	}
	if !sent && p.writes == 0 {
		return dispatch.SkipCall
	}
	return nil
}

// write sends p's change of target t, unless it would change nothing, and
// reports whether it sent it.
func (w *Writer[O]) write(ctx context.Context, n *note, t target, p *op[O], first *bool) (bool, error) {
	base := w.base(p)
	if p.reread || isNil(base) && (w.mode != ModeApply || w.applyRV) {
		var err error
		if base, err = w.read(ctx, n, p, first); err != nil {
			return false, err
		}
		if p.reread {
			p.reread = false
			w.n.conflicts.Add(1)
		}
	}
	pr, err := w.prepare(ctx, t, base, p)
	if err != nil {
		return false, err
	}
	var patch []byte
	if !pr.noop && w.mode == ModePatch {
		if patch, err = patchBody(t, pr.base, pr.desired, p.uid, p.strict); err != nil {
			return false, permanent(err)
		}
		pr.noop = patch == nil // nothing to set after all: equal once encoded
	}
	if pr.noop {
		if !p.counted[t] {
			p.counted[t] = true
			w.n.noOps.Add(1)
		}
		p.out = newer(p.out, base) // a read since the last write is newer
		return false, nil
	}
	if err := w.pay(ctx, first); err != nil {
		return false, err
	}
	w.n.writes.Add(1)
	out, err := w.send(ctx, t, pr, p, patch)
	if err != nil && t == targetStatus && apierrors.IsNotFound(err) {
		return false, w.statusNotFound(ctx, n, p, first, err)
	}
	if err != nil {
		return false, w.failed(err, n)
	}
	w.n.written.Add(1)
	p.out, p.writes = out, p.writes+1
	p.counted[t], p.landed[t] = true, true // written: a retry of the other target neither resends it nor counts it a no-op
	w.known.remember(p.uid, out)
	return true, nil
}

// base is the newest object known for p: the server's last answer, or p's
// object if it has a newer resourceVersion. nil if neither has one.
//
// p's object is not used if it is older than the writer's own last write
// to the object (see known).
func (w *Writer[O]) base(p *op[O]) O {
	obj := p.obj
	if obj.GetResourceVersion() == "" || w.known.stale(p.uid, obj) {
		var none O
		obj = none
	}
	return newer(w.known.get(p.uid), obj)
}

// read gets p's object from the server and makes it the baseline. A
// missing object, or one of another UID, ends the write.
func (w *Writer[O]) read(ctx context.Context, n *note, p *op[O], first *bool) (O, error) {
	var none O
	if err := w.pay(ctx, first); err != nil {
		return none, err
	}
	w.n.reads.Add(1)
	got, err := w.c.Get(ctx, p.obj)
	switch {
	case apierrors.IsNotFound(err):
		w.n.gone.Add(1)
		return none, permanent(fmt.Errorf("%w: %s (UID %s): %w", ErrGone, key(p.obj), p.uid, err))
	case err != nil:
		return none, withDelay(err, n)
	case got.GetUID() != p.uid:
		w.n.replaced.Add(1)
		return none, permanent(fmt.Errorf("%w: %s now has UID %s, not %s", ErrReplaced, key(p.obj), got.GetUID(), p.uid))
	}
	w.known.remember(p.uid, got)
	return got, nil
}

// pay takes a token for a request, unless it is the first of an
// execution, whose token the dispatcher took.
func (w *Writer[O]) pay(ctx context.Context, first *bool) error {
	if *first {
		*first = false
		return nil
	}
	if w.limiter == nil {
		return nil
	}
	if err := w.limiter.Wait(ctx); err != nil {
		return judged(fmt.Errorf("writer: rate limiter: %w", err), dispatch.ClassRetry)
	}
	return nil
}

// prepare applies p's change of target t to base (ModeApply: to an empty
// object) and judges whether it changes anything, reusing the work of an
// earlier call for the same base.
func (w *Writer[O]) prepare(ctx context.Context, t target, base O, p *op[O]) (prepared[O], error) {
	if pr := p.prep[t]; pr.done && sameObj(pr.base, base) {
		return pr, nil
	}
	if t == targetStatus && (w.status == statusNo || w.status == statusAsk && !hasStatus(p.obj)) {
		return prepared[O]{}, permanent(fmt.Errorf("writer: Desire.Status for %s: %T %w", key(p.obj), p.obj, errNoStatus))
	}
	var obj O
	if w.mode == ModeApply {
		like := base
		if isNil(like) {
			like = p.obj
		}
		obj = skeleton(like, p.uid)
	} else {
		obj = copyOf(base)
	}
	if err := w.call(ctx, p.desire.change(t), obj); err != nil {
		return prepared[O]{}, err
	}
	pin(obj, p)
	pr := prepared[O]{base: base, desired: obj, done: true}
	pr.noop = !isNil(base) && w.unchanged(t, base, obj)
	p.prep[t] = pr
	return pr, nil
}

// pin gives obj, a change's result, p's identity back: the namespace, name
// and UID of the object the desire is for, which its write is sent to and
// fenced by, whatever the change did to them.
func pin[O Object](obj O, p *op[O]) {
	if name := p.obj.GetName(); obj.GetName() != name {
		obj.SetName(name)
	}
	if ns := p.obj.GetNamespace(); obj.GetNamespace() != ns {
		obj.SetNamespace(ns)
	}
	if obj.GetUID() != p.uid {
		obj.SetUID(p.uid)
	}
}

// sameObj reports whether a and b are the same object (pointer).
func sameObj[O Object](a, b O) bool { return any(a) == any(b) }

// unchanged is the no-op test: ModeApply's configuration is already live;
// in the other modes, the change left the target as it was.
func (w *Writer[O]) unchanged(t target, base, desired O) bool {
	if w.mode != ModeApply {
		return same(t, base, desired)
	}
	cfg, err1 := unstructuredOf(desired)
	live, err2 := unstructuredOf(base)
	return err1 == nil && err2 == nil && subset(w.applyConfig(t, desired, cfg), part(t, live))
}

// unneeded reports whether p changes nothing on the newest object known,
// running its changes under ctx.
func (w *Writer[O]) unneeded(ctx context.Context, p *op[O]) bool {
	base := w.base(p)
	if isNil(base) {
		return false
	}
	n := 0
	for t := range numTargets {
		if p.desire.change(t) == nil {
			continue
		}
		if pr, err := w.prepare(ctx, t, base, p); err != nil || !pr.noop {
			return false
		}
		n++
	}
	w.n.noOps.Add(uint64(n))
	p.out = base
	return true
}

// send sends the write of pr, a change of target t; ModePatch's patch is
// patch.
func (w *Writer[O]) send(ctx context.Context, t target, pr prepared[O], p *op[O], patch []byte) (O, error) {
	sub := t.subresource()
	switch w.mode {
	case ModeUpdate:
		obj := pr.desired
		obj.SetUID(p.uid) // the fence: a precondition of the update
		obj.SetResourceVersion(pr.base.GetResourceVersion())
		return w.c.Update(ctx, obj, sub, metav1.UpdateOptions{FieldManager: w.manager})
	case ModePatch:
		return w.c.Patch(ctx, pr.base, types.JSONPatchType, patch, sub, metav1.PatchOptions{FieldManager: w.manager})
	}
	body, err := w.applyBody(t, pr, p)
	if err != nil {
		var none O
		return none, permanent(err)
	}
	opts := metav1.PatchOptions{FieldManager: w.manager}
	if w.force {
		opts.Force = &w.force
	}
	return w.c.Patch(ctx, pr.desired, types.ApplyPatchType, body, sub, opts)
}

// failed judges a refused write: a missing object, a recreated one, a
// refused patch test, an apply conflict with another manager.
func (w *Writer[O]) failed(err error, n *note) error {
	err = withDelay(err, n)
	switch {
	case apierrors.IsNotFound(err):
		w.n.gone.Add(1)
		return permanent(fmt.Errorf("%w: %w", ErrGone, err))
	case uidRefused(err):
		w.n.replaced.Add(1)
		return permanent(fmt.Errorf("%w: %w", ErrReplaced, err))
	case w.mode == ModePatch && testFailed(err):
		return judged(err, dispatch.ClassRecompute)
	case w.mode == ModeApply && managerConflict(err):
		return permanent(err)
	}
	return err
}

// beforeRetry is the dispatcher's BeforeRetry: a write refused as stale is
// re-read first thing in its next execution, so that the change is applied
// again to the object as it is now (and the no-op test judges against it);
// the read takes that execution's token, and a read the server refuses
// (a 429 with its Retry-After, say) is judged as any request is. Other
// retries resend as they are: the next attempt will tell.
func (w *Writer[O]) beforeRetry(_ context.Context, _ types.UID, p *op[O], lastErr error) (*op[O], bool, error) {
	if w.judge(lastErr) == dispatch.ClassRecompute {
		p.reread = true
		p.strict = p.strict || w.mode == ModePatch
	}
	return p, false, nil
}

// judge is the dispatcher's Classify: the writer's own verdicts, then the
// user's classifier or kube.Classify.
func (w *Writer[O]) judge(err error) dispatch.Class {
	var j *verdict
	if errors.As(err, &j) {
		return j.class
	}
	if w.classify != nil {
		return w.classify(err)
	}
	return kube.Classify(err)
}
