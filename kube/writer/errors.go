package writer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/coalescer/dispatch"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The fence's verdicts: a write that ends Failed with one of these (or
// Canceled with ErrGone, by Forget) wrote nothing.
var (
	// ErrGone: the object does not exist any more (404).
	ErrGone = errors.New("writer: the object is gone")
	// ErrReplaced: the object's name now holds another object, of another
	// UID — deleted and recreated — and the write was kept off it.
	ErrReplaced = errors.New("writer: the object was replaced by one of another UID")
)

// verdict is an error the writer has already judged.
type verdict struct {
	err   error
	class dispatch.Class
}

func (v *verdict) Error() string { return v.err.Error() }
func (v *verdict) Unwrap() error { return v.err }

func judged(err error, c dispatch.Class) error { return &verdict{err, c} }

func permanent(err error) error { return judged(err, dispatch.ClassPermanent) }

// uidRefused reports whether the server refused a write's metadata.uid as
// a change of an immutable field (422): the name holds an object of
// another UID. A patch or an apply gets this answer (an update gets 409,
// from the storage's precondition).
func uidRefused(err error) bool {
	return hasCause(err, apierrors.IsInvalid, func(c metav1.StatusCause) bool { return c.Field == "metadata.uid" })
}

// managerConflict reports whether an apply was refused for fields another
// field manager owns: re-reading does not resolve it.
func managerConflict(err error) bool {
	return hasCause(err, apierrors.IsConflict, func(c metav1.StatusCause) bool { return c.Type == metav1.CauseTypeFieldManagerConflict })
}

func hasCause(err error, is func(error) bool, match func(metav1.StatusCause) bool) bool {
	var status apierrors.APIStatus
	if !is(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	return slices.ContainsFunc(status.Status().Details.Causes, match)
}

// testFailed reports whether the server refused a JSON patch because one
// of its tests failed (or a path it tested is missing): the apiserver
// answers that with a 422 of its generic message and no field causes,
// where a validation error names its fields and an admission webhook's
// refusal says it in a message of its own. Every path a ModePatch patch
// touches is tested first, so this is the answer to a changed object, not
// to an invalid one.
func testFailed(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return false
	}
	s := status.Status()
	return (s.Details == nil || len(s.Details.Causes) == 0) && s.Message == patchRefused
}

// patchRefused is the message of the apiserver's answer to a JSON patch it
// could not apply (its patch handler's apierrors.NewGenericServerResponse,
// of code 422).
var patchRefused = apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", "", 0, false).ErrStatus.Message

// statusNotFound judges a status write answered 404: the apiserver answers
// so for an object that is gone, and alike (naming the object) for a
// resource that has no status subresource — a custom resource whose
// definition declares none. A read tells them apart: a missing object, or
// one of another UID, ends the write as read does; one that is there ends
// it with an error saying so, which no retry mends and which is not the
// server's 404 (that the object is gone, say, for apierrors.IsNotFound).
func (w *Writer[O]) statusNotFound(ctx context.Context, n *note, p *op[O], first *bool, err error) error {
	if _, rerr := w.read(ctx, n, p, first); rerr != nil {
		return rerr
	}
	return permanent(fmt.Errorf("writer: the status of %s cannot be written: its resource has no status subresource (the server answered the write: %v)", key(p.obj), err))
}
